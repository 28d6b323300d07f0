"""Shared pytest options: `--slow` enables the soak suites (many seeds, long runs)."""



def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False, help="run slow/soak tests")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    deselected = [item for item in items if "slow" in item.keywords]
    if deselected:
        items[:] = [item for item in items if "slow" not in item.keywords]
        config.hook.pytest_deselected(items=deselected)
