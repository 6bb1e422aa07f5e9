"""Pass/fail counting for the Python checks of the shell tests (tests/lib.sh's, in Python).

    import os, sys; sys.path.insert(0, os.environ["TESTS_DIR"]); from checks import Checks
    c = Checks()
    c(ok, "what was checked")      # prints "ok: ..." or "FAIL: ..." and counts it
    sys.exit(c.finish())           # "P passed, F failed"; 1 when any failed
"""
import sys


class Checks:
    def __init__(self, quiet_ok=False):
        self.passed = self.failed = 0
        self.quiet_ok = quiet_ok

    def __call__(self, ok, msg):
        if ok:
            self.passed += 1
            if not self.quiet_ok:
                print(f"ok: {msg}")
        else:
            self.failed += 1
            print(f"FAIL: {msg}")
        return ok

    def finish(self, name=""):
        print(f"{name + ': ' if name else ''}{self.passed} passed, {self.failed} failed")
        sys.stdout.flush()
        return 1 if self.failed else 0
