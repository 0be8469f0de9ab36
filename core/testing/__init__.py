"""The conformance kit: contract tests for one installed component, as a pytest plugin.

    pytest --core-conformance=attention:my_backend --core-conformance=platform:acme

runs the kit's tests for each named component (KIND:NAME, where NAME is an entry name of
the kind's entry-point group or a `module.path:Attr` reference) against core's CPU
references, and nothing else. The plugin (`core.testing.plugin`) is registered through
core's `pytest11` entry point, so it is loaded into every pytest run of an environment
where core is installed: this package stays import-light (no torch until the option is
given).
"""
