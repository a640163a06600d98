"""Tests for data_pipeline.download against loopback HTTP servers (no internet access)."""

import contextlib
import functools
import gzip
import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from data_pipeline import download

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_MULTI30K = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"
MULTI30K_FILES = download.DATASETS["multi30k"].files


class _QuietHandler(http.server.SimpleHTTPRequestHandler):

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    pass


@contextlib.contextmanager
def _serve(directory):
  """Serves `directory` on 127.0.0.1 and yields its base URL."""
  handler = functools.partial(_QuietHandler, directory=str(directory))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()
    thread.join()


def _dead_url():
  """Returns a loopback URL whose port has nothing listening."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return f"http://127.0.0.1:{s.getsockname()[1]}"


def _gunzipped_lines(path):
  with gzip.open(path, "rb") as f:
    return sum(1 for _ in f)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
  # A proxy from the environment would intercept the loopback requests.
  for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("no_proxy", "127.0.0.1")


@pytest.fixture(scope="module")
def multi30k_dir(tmp_path_factory):
  if not SHARED_MULTI30K.is_dir():
    pytest.skip(f"{SHARED_MULTI30K} is absent")
  out = tmp_path_factory.mktemp("multi30k")
  with _serve(SHARED_MULTI30K) as url:
    paths = download.download("multi30k", out, base_url=url, progress=False)
  assert paths == [str(out / name) for name in MULTI30K_FILES]
  return out


def test_downloads_all_files(multi30k_dir):
  assert len(MULTI30K_FILES) == 12
  assert sorted(os.listdir(multi30k_dir)) == sorted(MULTI30K_FILES)  # No temp files left.
  for name, lines in MULTI30K_FILES.items():
    path = multi30k_dir / name
    assert _gunzipped_lines(path) == lines, name
    assert path.read_bytes() == (SHARED_MULTI30K / name).read_bytes(), name


def test_rerun_is_idempotent(multi30k_dir):
  before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in multi30k_dir.iterdir()}
  # Nothing is fetched again: the run succeeds with no server at all.
  paths = download.download("multi30k", multi30k_dir, base_url=_dead_url(), progress=False)
  assert paths == [str(multi30k_dir / name) for name in MULTI30K_FILES]
  after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in multi30k_dir.iterdir()}
  assert after == before


def test_truncated_file_is_rejected(tmp_path):
  served = tmp_path / "served"
  served.mkdir()
  for name, lines in MULTI30K_FILES.items():
    n = 3 if name == "train.en.gz" else lines
    (served / name).write_bytes(gzip.compress(b"a caption\n" * n))
  out = tmp_path / "out"
  with _serve(served) as url, pytest.raises(download.DownloadError) as exc:
    download.download("multi30k", out, base_url=url, progress=False)
  path = os.path.join(out, "train.en.gz")
  assert str(exc.value) == (
      f"{path}: expected 29000 lines, got 3 (corrupt or truncated download)")
  assert not os.path.exists(path)
  assert not [f for f in os.listdir(out) if f.endswith(".part")]


def test_not_gzip_is_rejected(tmp_path):
  served = tmp_path / "served"
  served.mkdir()
  for name in MULTI30K_FILES:
    (served / name).write_bytes(b"<html>not found</html>\n")
  with _serve(served) as url, pytest.raises(download.DownloadError, match="not a gzip file"):
    download.download("multi30k", tmp_path / "out", base_url=url, progress=False)


def test_unreachable_server_names_data_dir(tmp_path):
  with pytest.raises(download.DownloadError) as exc:
    download.download("multi30k", tmp_path, base_url=_dead_url(), progress=False)
  assert "--data_dir" in str(exc.value)
  assert str(exc.value).startswith("cannot download http://127.0.0.1:")


def test_unknown_dataset():
  with pytest.raises(download.DownloadError, match="known: multi30k"):
    download.download("nope", "unused", progress=False)


def test_cli_failure_is_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "data_pipeline.download", "multi30k", "--out", str(tmp_path),
       "--base_url", _dead_url()],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 1
  assert "Traceback" not in result.stderr
  lines = result.stderr.splitlines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith("error: cannot download ")
  assert "--data_dir" in lines[0]
