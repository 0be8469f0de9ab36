"""The conformance kit's pytest plugin (core's `pytest11` entry point `core_conformance`).

pytest loads it into every run where core is installed, so at module level it imports
nothing but pytest: components, torch and the kit's test modules are imported only when
`--core-conformance` is given. Then the named components are resolved at configure time
(a name that cannot be had is a usage error saying why), and the session collects the
kit's own test modules for those kinds instead of the project's tests, wherever pytest
was started from.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

    from core.testing.targets import Target

KIT_DIR = Path(__file__).parent
_TARGETS = pytest.StashKey["dict[str, list[Target]]"]()
_QUANT_CONFIGS = pytest.StashKey["list[dict]"]()
_SPEC_OPTIONS = pytest.StashKey["dict[str, str]"]()
_KV_CONFIGS = pytest.StashKey["dict[str, str]"]()
_IO_DATA = pytest.StashKey["dict[str, object]"]()
_LOGITS_ARGS = pytest.StashKey["dict[str, object]"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("core-conformance", "core plugin conformance kit")
    group.addoption(
        "--core-conformance",
        action="append",
        default=[],
        metavar="KIND:NAME",
        dest="core_conformance",
        help="run the conformance kit for one component instead of the collected tests: "
        "KIND is platform, attention, sampler, quantization, kv_connector, model, "
        "spec_proposer, lora, io_processor, logits_processor, rejection_sampler or kernels "
        "(a core.general entry point that registers kernels for core's ops); NAME an entry "
        "name of that "
        "kind's entry-point group (rejection_sampler has none) or an importable module.path:Attr "
        "reference (`python -m pytest` puts the current directory on sys.path); "
        "repeatable, or comma-separated",
    )
    group.addoption(
        "--core-conformance-quant-config",
        action="append",
        default=[],
        metavar="JSON",
        dest="core_conformance_quant_config",
        help="a checkpoint's quantization_config to build the QuantizationConfig of method "
        'NAME from, if its "quant_method" is NAME (repeatable); default: {"quant_method": NAME}',
    )
    group.addoption(
        "--core-conformance-spec-options",
        action="append",
        default=[],
        metavar="NAME=JSON",
        dest="core_conformance_spec_options",
        help="the method's own speculative_config keys for proposer NAME in the kit's "
        'engine runs, where "{target}" stands for the target checkpoint\'s directory '
        '(e.g. draft_model={"model": "{target}"}); repeatable; default: {}',
    )
    group.addoption(
        "--core-conformance-kv-config",
        action="append",
        default=[],
        metavar="NAME=JSON",
        dest="core_conformance_kv_config",
        help="connector NAME's kv_connector_extra_config in the kit's kv_connector checks "
        '(e.g. p2p={"kv_port": 14650}); repeatable; default: {}',
    )
    group.addoption(
        "--core-conformance-io-data",
        action="append",
        default=[],
        metavar="NAME=JSON",
        dest="core_conformance_io_data",
        help="request data IO processor NAME must take (the `data` of a /pooling request), "
        'e.g. words={"words": ["w1"]}; repeatable; without it the kit checks only that '
        "NAME refuses garbage",
    )
    group.addoption(
        "--core-conformance-logits-args",
        action="append",
        default=[],
        metavar="NAME=JSON",
        dest="core_conformance_logits_args",
        help="the extra_args (a JSON object) of a request that asks logits processor NAME to "
        'act, e.g. ban={"banned_token_ids": [3]}; repeatable; without it the kit checks only '
        "that NAME leaves the requests that do not ask alone",
    )
    group.addoption(
        "--core-conformance-device",
        default="cpu",
        metavar="DEVICE",
        dest="core_conformance_device",
        help="torch device the component under test computes on (references run on the "
        "CPU); default: cpu",
    )


def pytest_configure(config: pytest.Config) -> None:
    options = config.getoption("core_conformance")
    if not options:
        return
    from core.plugins.components import parse_json_object
    from core.testing.targets import parse_targets, resolve

    flag, raw_configs = "--core-conformance-quant-config", "core_conformance_quant_config"
    try:
        targets = [resolve(spec) for spec in parse_targets(options)]
        config.stash[_QUANT_CONFIGS] = [
            parse_json_object(flag, raw) for raw in config.getoption(raw_configs)
        ]
        config.stash[_SPEC_OPTIONS] = _named_json(
            "--core-conformance-spec-options", config.getoption("core_conformance_spec_options")
        )
        config.stash[_KV_CONFIGS] = _named_json(
            "--core-conformance-kv-config", config.getoption("core_conformance_kv_config")
        )
        config.stash[_IO_DATA] = _parsed_json(
            "--core-conformance-io-data", config.getoption("core_conformance_io_data")
        )
        config.stash[_LOGITS_ARGS] = _parsed_json(
            "--core-conformance-logits-args", config.getoption("core_conformance_logits_args")
        )
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    by_kind: dict[str, list[Target]] = {}
    for target in targets:
        by_kind.setdefault(target.kind, []).append(target)
    config.stash[_TARGETS] = by_kind
    # Replacing the arguments (not filtering items) makes the kit independent of the
    # project's testpaths and rootdir. The kit's directory, rather than its files, is the
    # argument so that node ids name the module even outside the rootdir.
    config.args[:] = [str(KIT_DIR)]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Within the kit, collect only the modules of the kinds asked for."""
    by_kind = config.stash.get(_TARGETS, None)
    if by_kind is None or collection_path.parent != KIT_DIR or collection_path.is_dir():
        return None
    return collection_path.name not in {name for kind in by_kind for name in _module_names(kind)}


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect the kit's modules even where the project's python_files would not."""
    if _TARGETS not in parent.config.stash or file_path.parent != KIT_DIR:
        return None
    patterns = parent.config.getini("python_files")
    if any(fnmatch.fnmatch(file_path.name, pattern) for pattern in patterns):
        return None  # pytest's python plugin collects it
    return pytest.Module.from_parent(parent, path=file_path)


def _named_json(flag: str, items: list[str]) -> dict[str, str]:
    """{NAME: JSON text} of `flag`'s `NAME=JSON` items (parsed when used: the spec
    options' "{target}" is filled first)."""
    named = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{flag} {item!r}: expected NAME=JSON")
        named[name] = text
    return named


def _parsed_json(flag: str, items: list[str]) -> dict[str, object]:
    """{NAME: the JSON value} of `flag`'s `NAME=JSON` items; ValueError naming the item
    whose text is not JSON."""
    import json

    parsed = {}
    for name, text in _named_json(flag, items).items():
        try:
            parsed[name] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{flag} {name}: not JSON: {exc}") from exc
    return parsed


# Kit modules that check more than one kind, beside each kind's own test_KIND.py.
_SHARED_MODULES = {
    "kernels": ("test_batch_invariance.py",),
    "attention": ("test_batch_invariance.py",),
}


def _module_names(kind: str) -> tuple[str, ...]:
    return (f"test_{kind}.py", *_SHARED_MODULES.get(kind, ()))


def pytest_report_header(config: pytest.Config) -> list[str]:
    by_kind = config.stash.get(_TARGETS, {})
    return [
        f"core conformance: {target.kind}:{target.spec.name}"
        for targets in by_kind.values()
        for target in targets
    ]


def targets_of(config: pytest.Config, kind: str) -> list[Target]:
    """The components of `kind` named on the command line (none without the option)."""
    return config.stash.get(_TARGETS, {}).get(kind, [])


def spec_options_of(config: pytest.Config, name: str, target_dir: str) -> dict:
    """Proposer `name`'s --core-conformance-spec-options, "{target}" replaced by
    `target_dir` ({} when none were given)."""
    from core.plugins.components import parse_json_object

    text = config.stash.get(_SPEC_OPTIONS, {}).get(name, "{}")
    return parse_json_object(
        "--core-conformance-spec-options", text.replace("{target}", target_dir)
    )


def kv_config_of(config: pytest.Config, name: str) -> dict:
    """Connector `name`'s --core-conformance-kv-config ({} when none was given)."""
    from core.plugins.components import parse_json_object

    text = config.stash.get(_KV_CONFIGS, {}).get(name, "{}")
    return parse_json_object("--core-conformance-kv-config", text)


def io_data_of(config: pytest.Config, name: str) -> object | None:
    """The --core-conformance-io-data of IO processor `name`; None when none was given (a
    JSON null is no data a processor takes: the kit checks that it refuses it)."""
    return config.stash.get(_IO_DATA, {}).get(name)


def logits_args_of(config: pytest.Config, name: str) -> object | None:
    """The --core-conformance-logits-args of logits processor `name`; None when none was
    given."""
    return config.stash.get(_LOGITS_ARGS, {}).get(name)


def quant_configs_of(config: pytest.Config) -> list[dict]:
    """The parsed --core-conformance-quant-config objects, in order (none given: [])."""
    return config.stash.get(_QUANT_CONFIGS, [])


@pytest.fixture
def core_conformance_device(request: pytest.FixtureRequest) -> torch.device:
    """The torch device the component under test runs on (--core-conformance-device)."""
    import torch

    return torch.device(request.config.getoption("core_conformance_device"))
