"""tests/report_page_render.py [--full-page] CHROMIUM OUT_DIR NAME=HTML...

Renders report pages in one headless Chromium, driven over its DevTools pipe
(--remote-debugging-pipe: NUL-terminated JSON on file descriptors 3 and 4, so
no network port and no library): for each page, loads it, waits until its
script has set body[data-ready=yes], and writes OUT_DIR/NAME.dom.html (the
DOM after the script ran, as --dump-dom would) and OUT_DIR/NAME.png (a
screenshot of the first 1400 x 1000 px; with --full-page, of the whole page,
at most 2400 px tall: docs/img/ was made so). One browser for every
page: starting Chromium costs seconds on a loaded 2-core machine, a page a
fraction of one.
"""
import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

WIDTH = 1400


class Browser:
    def __init__(self, chromium, profile):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4.
        def child_fds():
            # Via fds above 4 first: either pipe end may itself be 3 or 4.
            os.dup2(to_chrome_r, 100)
            os.dup2(from_chrome_w, 101)
            os.dup2(100, 3)
            os.dup2(101, 4)
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-default-apps",
             "--user-data-dir=" + profile, "--remote-debugging-pipe",
             "--window-size=%d,1000" % WIDTH, "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child_fds, close_fds=False, start_new_session=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.next_id = 0
        self.buffer = b""
        self.events = []

    def _read_message(self, deadline):
        while b"\0" not in self.buffer:
            if time.time() > deadline:
                raise TimeoutError("no reply from chromium")
            chunk = os.read(self.from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, params=None, session=None, timeout=30):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def close(self):
        # Nothing to save: end the browser at once, not through
        # Browser.close's slow shutdown. Debian's `chromium` is a wrapper
        # script, so the browser and its renderers are signalled as the
        # process group this script started (start_new_session).
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        # Its renderers may outlive the browser by a moment.
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        os.close(self.to_chrome)
        os.close(self.from_chrome)


def render(browser, session, html, dom_path, png_path, full_page):
    browser.call("Page.navigate", {"url": "file://" + os.path.abspath(html)}, session)
    evaluate = lambda expr: browser.call(
        "Runtime.evaluate", {"expression": expr, "returnByValue": True}, session)["result"].get("value")
    deadline = time.time() + 20
    while evaluate("document.readyState === 'complete' && document.body && "
                   "document.body.getAttribute('data-ready')") != "yes":
        if time.time() > deadline:
            raise TimeoutError(f"{html}: the page's script did not finish (data-ready)")
        time.sleep(0.05)
    with open(dom_path, "w", encoding="utf-8") as f:
        f.write(evaluate("'<!DOCTYPE html>\\n' + document.documentElement.outerHTML"))
    if full_page:
        height = min(2400, int(evaluate("document.documentElement.scrollHeight")))
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
    shot = browser.call("Page.captureScreenshot", {"format": "png"}, session)
    with open(png_path, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    if full_page:
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": WIDTH, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session)


def main():
    full_page = "--full-page" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--full-page"]
    chromium, out = args[0], args[1]
    pages = [arg.split("=", 1) for arg in args[2:]]
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        started = time.time()
        browser = Browser(chromium, profile)
        failed = 0
        try:
            target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            browser.call("Page.enable", {}, session)
            print(f"chromium started in {time.time() - started:.1f} s")
            browser.call("Emulation.setDeviceMetricsOverride",
                         {"width": WIDTH, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session)
            for name, html in pages:
                try:
                    started = time.time()
                    render(browser, session, html, os.path.join(out, name + ".dom.html"),
                           os.path.join(out, name + ".png"), full_page)
                    print(f"rendered {name} in {time.time() - started:.1f} s: {html}")
                except (TimeoutError, RuntimeError) as e:
                    print(f"FAIL {name}: {e}")
                    failed += 1
        finally:
            browser.close()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
