# Imported now, before any test starts a thread: hypothesis's pytest plugin imports it at the end of the session
# otherwise, and compiling its modules then (assertion rewriting) can meet a thread formatting a traceback, which
# CPython 3.11 before 3.11.8 cannot do at once (common/logs.py; the binder suites failed so once after every test
# had passed).
import hypothesis  # noqa: F401

pytest_plugins = ["testbed.pytest_fixtures"]
