"""The chromium the browser tests drive through playwright, which never downloads a browser: CHROMIUM
names it, else the first of chromium, chromium-browser, google-chrome (and Chrome's place on macOS).
`python -m tests.support.browser --found` prints its path, or how to get one and exits 1 (make browser)."""

import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MACOS = Path("/Applications/Google Chrome.app/Contents/MacOS/Google Chrome")
HOW = ("the browser tests need a chromium: on Debian or Ubuntu `sudo apt-get install chromium` (make test "
       "installs it when run as root), on Fedora `sudo dnf install chromium`, on macOS Google Chrome; or set "
       "CHROMIUM=/path/to/chrome")


def find() -> str | None:
    named = os.environ.get("CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    found = next(filter(None, map(shutil.which, NAMES)), None)
    return found or (str(MACOS) if MACOS.is_file() else None)


def executable() -> str:
    """The path, or an AssertionError that says how to get one (never a skip: a browser test that did
    not run has not passed)."""
    found = find()
    named = os.environ.get("CHROMIUM")
    assert found, f"CHROMIUM={named} is not a file" if named else HOW
    return found


FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def chromium():
    """Debian's chromium under playwright. Used after the test's database work: playwright's sync API
    runs an event loop in this thread, and Django keeps the database away from async contexts."""
    from playwright.sync_api import sync_playwright

    found = executable()  # fails saying how to get one when there is none
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=found, args=FLAGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


if __name__ == "__main__":
    if "--found" in sys.argv[1:] and (path := find()):
        print(path)
        sys.exit(0)
    print(f"make: {HOW}", file=sys.stderr)
    sys.exit(1)
