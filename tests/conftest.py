pytest_plugins = ["testbed.pytest_fixtures"]
