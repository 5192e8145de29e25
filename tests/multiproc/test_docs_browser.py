"""The docs site in a real browser: headless Chromium renders the index and two generated pages with no
broken image and no console error, and leaves a screenshot of each.

The site is built with MkDocs (as tests/unit/test_docs.py builds it), served from 127.0.0.1 only, and
Chromium is driven through chromedriver's W3C WebDriver HTTP API on loopback with the standard library
(no Selenium). A static check of the Markdown cannot see what the browser sees: an image path that
resolves on disk but not under the site's URLs, a theme asset fetched from the internet, a script error.

Screenshots go to $HVD_EASGD_SCREENSHOTS when it is set, else to the test's tmp dir. Chromium and
chromedriver are Debian's (`make setup` installs them), so a missing one fails rather than skips.
This is a launching test (it starts Chromium), hence the multiproc tier.
"""
import base64
import functools
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.helpers import ROOT, bounded, mkdocs_build

pytestmark = pytest.mark.multiproc

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS_ENV = "HVD_EASGD_SCREENSHOTS"
# The index and two pages that the benchmarks render from committed results, each with its figure.
PAGES = {"index": "", "projection": "projection/", "time-to-accuracy": "time-to-accuracy/"}
# Every switch that would let Chromium reach the network on its own (updates, sync, field trials) is off,
# and the profile is new and empty, so nothing from an earlier run is loaded.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1600"]
# Broken: an <img> that finished loading with no pixels. Counted too, so "no broken image" on a page
# that has images is a statement about those images.
IMAGES_SCRIPT = """
const images = Array.from(document.images);
return {count: images.length,
        broken: images.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute('src'))};
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriver:
    """The few W3C WebDriver commands the test needs, over chromedriver's HTTP API on loopback."""

    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"
        self.session = None

    def call(self, method, path, payload=None, timeout=20):
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=bounded(timeout)) as response:
                return json.load(response)["value"]
        except urllib.error.HTTPError as e:
            raise AssertionError(f"WebDriver {method} {path}: {e.read().decode()[:2000]}") from None

    def start(self, user_data_dir):
        capabilities = {"browserName": "chrome",
                        "goog:chromeOptions": {"binary": CHROMIUM,
                                               "args": CHROMIUM_ARGS + [f"--user-data-dir={user_data_dir}"]},
                        "goog:loggingPrefs": {"browser": "ALL"}}
        value = self.call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}}, timeout=30)
        self.session = value["sessionId"]

    def command(self, method, name, payload=None):
        return self.call(method, f"/session/{self.session}/{name}", payload)

    def open(self, url):
        self.command("POST", "url", {"url": url})  # returns once the page has loaded (pageLoadStrategy normal)

    def script(self, body):
        return self.command("POST", "execute/sync", {"script": body, "args": []})

    def browser_log(self):
        # Chromium's console and its network errors since the last read (chromedriver's log endpoint).
        return self.command("POST", "se/log", {"type": "browser"})

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.command("GET", "screenshot")))

    def quit(self):
        if self.session:
            try:
                self.call("DELETE", f"/session/{self.session}", timeout=10)
            except (OSError, AssertionError):
                pass  # the driver's process is ended below in any case


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass  # a line per request would bury a failure's output


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site_dir = tmp_path_factory.mktemp("site")
    result = mkdocs_build(os.path.join(ROOT, "mkdocs.yml"), site_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # A control page, outside the real site's pages: one image that cannot load and one console error.
    # The checks below must find both there, so their finding nothing on a real page means something.
    (site_dir / "control.html").write_text(
        # An empty icon: otherwise Chromium asks for /favicon.ico, whose 404 would be logged later.
        "<!doctype html><html><head><link rel='icon' href='data:,'></head><body><img src='no-such-image.png' alt='missing'>"
        "<script>console.error('control: this error is expected')</script></body></html>")
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    for program in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(program), f"{program} is missing: `make setup` installs chromium and chromium-driver"
    port = _free_port()
    log = tmp_path_factory.mktemp("chromedriver") / "chromedriver.log"
    driver_proc = subprocess.Popen([CHROMEDRIVER, f"--port={port}", "--allowed-ips=127.0.0.1",
                                    f"--log-path={log}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
    driver = WebDriver(port)
    try:
        deadline = time.monotonic() + bounded(10)
        while True:
            try:
                if driver.call("GET", "/status", timeout=2)["ready"]:
                    break
            except OSError:
                pass
            assert driver_proc.poll() is None and time.monotonic() < deadline, \
                f"chromedriver did not answer on 127.0.0.1:{port}"
            time.sleep(0.1)
        driver.start(tmp_path_factory.mktemp("chromium-profile"))
        yield driver
    finally:
        driver.quit()
        driver_proc.terminate()
        try:
            driver_proc.wait(timeout=bounded(10))
        except subprocess.TimeoutExpired:
            driver_proc.kill()
            driver_proc.wait()


def _screenshot_dir(tmp_path):
    directory = os.environ.get(SCREENSHOTS_ENV) or str(tmp_path)
    os.makedirs(directory, exist_ok=True)
    return directory


def _errors(log):
    return [entry for entry in log if entry.get("level") == "SEVERE"]


@pytest.mark.timeout(60)
def test_the_index_and_two_generated_pages_render_with_no_broken_image_and_no_console_error(site, browser,
                                                                                            tmp_path):
    started = time.monotonic()
    browser.browser_log()  # whatever the new profile logged before the first page is not a page's
    browser.open(site + "control.html")
    control_images, control_log = browser.script(IMAGES_SCRIPT), browser.browser_log()
    assert control_images["broken"] == ["no-such-image.png"], control_images
    assert any("this error is expected" in e["message"] for e in _errors(control_log)), control_log

    screenshots = _screenshot_dir(tmp_path)
    for name, path in PAGES.items():
        browser.open(site + path)
        title = browser.script("return document.title;")
        assert "hvd_easgd" in title, (name, title)  # the page itself, not an error page of the server
        images = browser.script(IMAGES_SCRIPT)
        # The two generated pages each lead with a figure; the index's images are the theme's own.
        if name != "index":
            assert images["count"] >= 1, (name, images)
        assert images["broken"] == [], (name, images)
        assert _errors(browser.browser_log()) == [], name
        browser.screenshot(os.path.join(screenshots, f"{name}.png"))
        assert os.path.getsize(os.path.join(screenshots, f"{name}.png")) > 10_000, name
    # The brief's bound: the whole check (after the build and the browser start) well within 30 s.
    assert time.monotonic() - started < bounded(30)
