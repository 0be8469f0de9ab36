import subprocess
import sys

import torch

from core.platforms.torch_build import torch_build


def test_torch_build_matches_the_imported_torch():
    build = torch_build()
    assert build is not None
    assert build.version == torch.__version__
    assert build.cuda == torch.version.cuda
    assert build.hip == getattr(torch.version, "hip", None)


def test_reading_the_build_does_not_import_torch():
    code = (
        "import sys\n"
        "from core.platforms.torch_build import torch_build\n"
        "assert torch_build() is not None\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
