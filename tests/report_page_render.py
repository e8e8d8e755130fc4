"""tests/report_page_render.py CHROMIUM OUT_DIR NAME=HTML...

Renders report pages in one headless Chromium, driven over its DevTools pipe
(--remote-debugging-pipe: NUL-terminated JSON on file descriptors 3 and 4, so
no network port and no library): for each page, loads it, waits until its
script has set body[data-ready=yes], and writes OUT_DIR/NAME.dom.html (the
DOM after the script ran, as --dump-dom would) and OUT_DIR/NAME.png (a
screenshot of the whole page, at most 2400 px tall). One browser for every
page: starting Chromium costs seconds on a loaded 2-core machine, a page a
fraction of one.
"""
import base64
import json
import os
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
            preexec_fn=child_fds, close_fds=False)
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
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def render(browser, session, html, dom_path, png_path):
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
    height = min(2400, int(evaluate("document.documentElement.scrollHeight")))
    browser.call("Emulation.setDeviceMetricsOverride",
                 {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
    evaluate("window.dispatchEvent(new Event('resize')); 1")
    shot = browser.call("Page.captureScreenshot", {"format": "png"}, session)
    with open(png_path, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    browser.call("Emulation.setDeviceMetricsOverride",
                 {"width": WIDTH, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session)


def main():
    chromium, out = sys.argv[1], sys.argv[2]
    pages = [arg.split("=", 1) for arg in sys.argv[3:]]
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(chromium, profile)
        failed = 0
        try:
            target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            browser.call("Page.enable", {}, session)
            browser.call("Emulation.setDeviceMetricsOverride",
                         {"width": WIDTH, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session)
            for name, html in pages:
                try:
                    render(browser, session, html, os.path.join(out, name + ".dom.html"),
                           os.path.join(out, name + ".png"))
                    print(f"rendered {name}: {html}")
                except (TimeoutError, RuntimeError) as e:
                    print(f"FAIL {name}: {e}")
                    failed += 1
        finally:
            browser.close()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
