"""rawgraph's ``pytest11`` entry point: the options of its pytest plugin, and nothing else.

pytest imports every installed ``pytest11`` entry point in every run, the runs of projects that
never asked for rawgraph too. So this module is top level and imports nothing of rawgraph (which
would load NumPy and the CUDA bindings into each of those runs): it adds the options, so that
``pytest --help`` lists them, and loads the plugin itself, :mod:`rawgraph.testing`, only where
the ini option ``rawgraph_testing = true`` asks for it. ``-p rawgraph.testing`` and
``pytest_plugins = ["rawgraph.testing"]`` load the plugin without it.
"""

from __future__ import annotations

from typing import Any

PLUGIN = "rawgraph.testing"
GROUP = "rawgraph"


def add_options(parser: Any) -> None:
    """Add the plugin's options to pytest's ``parser``, once.

    Both this module and :mod:`rawgraph.testing` call it from ``pytest_addoption``, whichever
    pytest registers first (the entry point, or ``-p rawgraph.testing`` with autoloading off);
    argparse refuses an option added twice, so the second call must add nothing.
    """
    if getattr(parser, "_rawgraph_options_added", False):
        return
    parser._rawgraph_options_added = True
    group = parser.getgroup(
        GROUP, "rawgraph (enable the plugin with -p rawgraph.testing or the ini option rawgraph_testing)"
    )
    group.addoption(
        "--rawgraph-doctor",
        action="store_true",
        default=False,
        dest="rawgraph_doctor",
        help="run rawgraph's graph doctor over every graph a test instantiates; any finding "
        "fails the run (tests marked no_doctor are left out)",
    )
    parser.addini(
        "rawgraph_testing",
        type="bool",
        default=False,
        help="load rawgraph's pytest plugin: the gpu marker, the device, stream and fake_driver fixtures",
    )
    parser.addini("rawgraph_doctor", type="bool", default=False, help="as --rawgraph-doctor, from the ini file")


def pytest_addoption(parser: Any) -> None:
    add_options(parser)


def pytest_configure(config: Any) -> None:
    if config.getini("rawgraph_testing") and not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.import_plugin(PLUGIN)
