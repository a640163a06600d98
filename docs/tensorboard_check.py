"""Checks TensorBoard in a real browser: `python docs/tensorboard_check.py [--screenshots docs]`.

Trains the tiny preset for a few hundred steps on a made-up task (reverse a word sequence), or
takes the logs of a finished run (--model_dir), starts `tensorboard --logdir` on them, opens the
Scalars, Text and Images dashboards in headless Chromium, and checks that each shows the run's
data: the training and dev curves (gradient norm and clip fraction among them), the dev
translations, and the attention heat maps. With --screenshots it saves one PNG of each
dashboard there (the README shows them).

Needs Chromium (Debian: `apt-get install chromium`). Exit code 0 when every dashboard shows its
data, 1 otherwise, with one line per dashboard either way.
"""

import argparse
import base64
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = "tiny_reversal"
# What the rendered page of each dashboard must hold: the run's name and its tags (read from
# the DOM after the page's scripts have fetched the data).
DASHBOARDS = {
    "scalars": ["grad_norm", "clip_fraction", "tokens_per_sec", "bleu", "chrf",
                f"{RUN}/train", f"{RUN}/eval"],
    "text": ["translations", "reference", "output"],
    "images": ["attention/1", "attention/2", "individualImage"],
}
# the scalars worth a picture side by side, in one group
_URL_OPTIONS = {"scalars": "&tagFilter=" + urllib.parse.quote(
    "^(bleu|chrf|grad_norm|clip_fraction|loss|tokens_per_sec)$")}
_BROWSERS = ("chromium", "chromium-browser", "google-chrome")
_WORDS = [chr(ord("a") + i) * 2 for i in range(20)]


def write_corpus(folder: str, seed: int = 0):
  """train/val/test .src/.tgt: 2-8 words of 20, the target the source reversed."""
  rng = random.Random(seed)
  for split, count in (("train", 3000), ("val", 100), ("test", 50)):
    sentences = [[rng.choice(_WORDS) for _ in range(rng.randint(2, 8))] for _ in range(count)]
    for lang, lines in (("src", sentences), ("tgt", [s[::-1] for s in sentences])):
      with open(os.path.join(folder, f"{split}.{lang}"), "w", encoding="utf-8") as f:
        f.writelines(" ".join(words) + "\n" for words in lines)


def train(data_dir: str, model_dir: str, steps: int):
  subprocess.run([sys.executable, "-m", "tf_transformer.train", "--flagfile=flags/tiny.cfg",
                  f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--src_lang=src",
                  "--tgt_lang=tgt", "--test_prefix=test", f"--train_steps={steps}",
                  "--eval_every=100", "--clip_norm=1.0"],
                 cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_tensorboard(logdir: str, port: int, timeout_s: float = 120.0) -> subprocess.Popen:
  """`tensorboard --logdir` on 127.0.0.1:port, once it lists the run's train and eval logs."""
  server = subprocess.Popen(
      [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1",
       "--port", str(port), "--reload_interval", "1"],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    try:
      with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as response:
        if {f"{RUN}/train", f"{RUN}/eval"} <= set(json.load(response)):
          return server
    except OSError:
      pass
    if server.poll() is not None:
      raise RuntimeError(f"tensorboard exited with code {server.returncode}")
    time.sleep(1.0)
  server.kill()
  raise RuntimeError(f"tensorboard did not list the run within {timeout_s:.0f} s")


def find_browser() -> str:
  for name in _BROWSERS:
    path = shutil.which(name)
    if path:
      return path
  raise RuntimeError("no Chromium found (Debian: apt-get install chromium)")


class DevTools:
  """The Chrome DevTools protocol over one page's WebSocket (RFC 6455 text frames, written
  with the standard library: the check needs nothing beyond the browser)."""

  def __init__(self, websocket_url: str):
    address, path = websocket_url[len("ws://"):].split("/", 1)
    host, port = address.split(":")
    self.socket = socket.create_connection((host, int(port)), timeout=60)
    key = base64.b64encode(os.urandom(16)).decode()
    self.socket.sendall(
        f"GET /{path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    response = b""
    while b"\r\n\r\n" not in response:
      response += self.socket.recv(4096)
    if b" 101 " not in response.split(b"\r\n")[0]:
      raise RuntimeError(f"DevTools refused the connection: {response[:100]!r}")
    self.buffer = response.split(b"\r\n\r\n", 1)[1]
    self.next_id = 0

  def _read(self, count: int) -> bytes:
    while len(self.buffer) < count:
      chunk = self.socket.recv(1 << 20)
      if not chunk:
        raise RuntimeError("the browser closed the DevTools connection")
      self.buffer += chunk
    data, self.buffer = self.buffer[:count], self.buffer[count:]
    return data

  def _receive(self) -> str:
    message = b""
    while True:
      first, second = self._read(2)
      length = second & 0x7F
      if length >= 126:
        length = int.from_bytes(self._read(2 if length == 126 else 8), "big")
      message += self._read(length)
      if first & 0x80:  # FIN: the last fragment
        return message.decode("utf-8")

  def call(self, method: str, **params):
    """Sends a command; returns its result (events in between are dropped)."""
    self.next_id += 1
    data = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
    header = bytearray([0x81])  # FIN + text frame
    if len(data) < 126:
      header.append(0x80 | len(data))
    else:
      header += bytes([0x80 | 127]) + len(data).to_bytes(8, "big")
    mask = os.urandom(4)
    self.socket.sendall(bytes(header) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
    while True:
      message = json.loads(self._receive())
      if message.get("id") == self.next_id:
        if "error" in message:
          raise RuntimeError(f"{method}: {message['error']}")
        return message["result"]


# The text of the page, shadow roots included (TensorBoard's dashboards are web components),
# with a marker per loaded image and per drawn chart line.
_PAGE_TEXT = """(() => {
  const parts = [];
  const visit = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { parts.push(node.textContent); return; }
    if (node.tagName === 'IMG' && node.complete && node.naturalWidth > 0) {
      parts.push(' LOADED_IMAGE:' + node.src + ' ');
    }
    if (node.tagName === 'path' && (node.getAttribute('d') || '').length > 20 &&
        (node.getAttribute('class') || '').includes('line')) { parts.push(' DRAWN_LINE '); }
    if (node.shadowRoot) visit(node.shadowRoot);
    for (const child of node.childNodes) visit(child);
  };
  visit(document.documentElement);
  return parts.join(' ');
})()"""


def start_browser(browser: str, timeout_s: float = 60.0):
  """Headless Chromium with a DevTools port; returns (process, DevTools of its page)."""
  port = free_port()
  profile = tempfile.mkdtemp(prefix="chromium_")
  process = subprocess.Popen(
      [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
       f"--remote-debugging-port={port}", f"--user-data-dir={profile}",
       "--window-size=1500,1000", "--hide-scrollbars", "about:blank"],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    try:
      with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as response:
        pages = [t for t in json.load(response) if t["type"] == "page"]
      if pages:
        return process, DevTools(pages[0]["webSocketDebuggerUrl"]), profile
    except OSError:
      pass
    time.sleep(0.5)
  process.kill()
  raise RuntimeError(f"{browser} opened no DevTools port within {timeout_s:.0f} s")


def check(port: int, browser: str, screenshots: str | None, timeout_s: float = 90.0) -> dict:
  """{dashboard: (expected strings its page lacks, drawn lines, loaded images)}; waits up to
  `timeout_s` for each page to show everything, then saves its screenshot."""
  process, devtools, profile = start_browser(browser)
  found = {}
  try:
    for dashboard, expected in DASHBOARDS.items():
      devtools.call("Page.navigate", url=f"http://127.0.0.1:{port}/#{dashboard}"
                    + _URL_OPTIONS.get(dashboard, ""))
      deadline = time.monotonic() + timeout_s
      counts = []
      while True:
        time.sleep(1.0)
        text = devtools.call("Runtime.evaluate", expression=_PAGE_TEXT,
                             returnByValue=True)["result"]["value"]
        absent = [item for item in expected if item not in text]
        lines, images = text.count("DRAWN_LINE"), text.count("LOADED_IMAGE:")
        counts.append((lines, images))
        # everything there, and no chart line or image added for three seconds
        shown = not absent and (dashboard != "scalars" or lines) and (
            dashboard != "images" or images) and len(set(counts[-4:])) == 1 and len(counts) > 3
        if shown or time.monotonic() > deadline:
          break
      found[dashboard] = (absent, lines, images)
      if screenshots:
        png = devtools.call("Page.captureScreenshot", format="png")["data"]
        with open(os.path.join(screenshots, f"tensorboard_{dashboard}.png"), "wb") as f:
          f.write(base64.b64decode(png))
  finally:
    process.terminate()
    process.wait(timeout=30)
    shutil.rmtree(profile, ignore_errors=True)
  return found


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--screenshots", help="folder for tensorboard_<dashboard>.png")
  parser.add_argument("--steps", type=int, default=300, help="training steps of the tiny run")
  parser.add_argument("--model_dir", help="show this finished run's TensorBoard logs (its "
                      "train/ and eval/) instead of training the tiny one")
  args = parser.parse_args()
  browser = find_browser()
  if args.screenshots:
    os.makedirs(args.screenshots, exist_ok=True)
  with tempfile.TemporaryDirectory() as folder:
    logdir = os.path.join(folder, "models")
    if args.model_dir:
      for part in ("train", "eval"):
        shutil.copytree(os.path.join(args.model_dir, part), os.path.join(logdir, RUN, part))
    else:
      write_corpus(folder)
      train(folder, os.path.join(logdir, RUN), args.steps)
    port = free_port()
    server = start_tensorboard(logdir, port)
    try:
      found = check(port, browser, args.screenshots and os.path.abspath(args.screenshots))
    finally:
      server.terminate()
      server.wait(timeout=30)
  failed = False
  for dashboard, (absent, lines, images) in found.items():
    ok = not absent and (dashboard != "scalars" or lines) and (dashboard != "images" or images)
    failed |= not ok
    shown = [text for text in DASHBOARDS[dashboard] if text not in absent]
    drawn = {"scalars": f"; {lines} chart lines drawn", "images": f"; {images} images loaded"}
    print(f"{dashboard}: {'ok' if ok else 'MISSING ' + ', '.join(absent)}; shows "
          f"{', '.join(shown)}{drawn.get(dashboard, '')}")
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  main()
