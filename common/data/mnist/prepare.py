"""prepare_mnist: real MNIST into a data_dir once, from a local folder or a URL (datasets/prepare_mnist.py)."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path


from common.data.mnist.idx import gunzip_if_named, parse_idx, read_bytes, write_idx
from common.data.mnist.layout import ALL_FILES, MNIST_FILES, SPLITS, check_split, warn_if_legacy_processed
from common.errors import UserError

# The scripts by their absolute paths, so that a printed command works from any directory
# (the zoo is installed, `pip install -e .`, so the scripts find `common` from anywhere).
PREPARE_SCRIPT = Path(__file__).resolve().parents[3] / "datasets" / "prepare_mnist.py"
PREPARE_COMMAND = (f"python {shlex.quote(str(PREPARE_SCRIPT))} --source <folder with the four IDX files> "
                   "--data_dir {}")


@dataclass(frozen=True)
class PreparedFile:
    """One file written by ``prepare_mnist``."""

    path: str  # where it now is, in data_dir/MNIST/raw
    source: str  # the file or URL it came from
    shape: tuple[int, ...]


def prepare_mnist(source: str, data_dir: str) -> list[PreparedFile]:
    """Put the four MNIST files from `source` into data_dir/MNIST/raw, uncompressed.

    `source` is a local folder holding the four files (gzipped or not; names with or
    without .gz, `-idx3-ubyte` or `.idx3-ubyte`; also searched: source/MNIST/raw) or an
    http(s)/ftp/file URL of a folder to download them from. Every file is read and
    checked before anything is written, so bad input leaves data_dir as it was.
    """
    source, data_dir = os.fspath(source), os.fspath(data_dir)
    if urllib.parse.urlparse(source).scheme in ("http", "https", "ftp", "file"):
        fetched = _download_mnist(source)
    else:
        fetched = _find_local_mnist(source)
    arrays = {}  # name -> (origin, array)
    for name, (origin, data) in fetched.items():
        arrays[name] = (origin, parse_idx(gunzip_if_named(data, origin), origin))
    for split in SPLITS:
        check_split(*(arrays[name] for name in MNIST_FILES[split]))

    # All four are written into a staging folder beside raw/ first, so a failed write
    # (a full disk) leaves no mix of old and new files in raw/.
    raw_dir = os.path.join(data_dir, "MNIST", "raw")
    created = _makedirs_tracked(raw_dir)
    staging = tempfile.mkdtemp(dir=os.path.dirname(raw_dir), prefix=".raw-staging-")
    try:
        for name, (_, array) in arrays.items():
            write_idx(os.path.join(staging, name), array)
    except BaseException:
        shutil.rmtree(staging)
        for folder in created:
            os.rmdir(folder)
        raise
    for name in arrays:
        os.replace(os.path.join(staging, name), os.path.join(raw_dir, name))
    os.rmdir(staging)
    warn_if_legacy_processed(data_dir)
    return [
        PreparedFile(os.path.join(raw_dir, name), origin, array.shape) for name, (origin, array) in arrays.items()
    ]


def _makedirs_tracked(folder: str) -> list[str]:
    """os.makedirs(folder), returning the folders it created, deepest first."""
    created = []
    current = os.path.abspath(folder)
    while not os.path.isdir(current):
        if os.path.exists(current):
            raise UserError(f"{current}: exists and is not a folder")
        created.append(current)
        current = os.path.dirname(current)
    os.makedirs(folder, exist_ok=True)
    return created


def _spellings(name: str) -> list[str]:
    # Files from some mirrors spell "train-images.idx3-ubyte" with a dot.
    return [name, name.replace("-idx", ".idx")]


def _find_local_mnist(source: str) -> dict[str, tuple[str, bytes]]:
    """name -> (path, raw bytes) for the four files in a folder. An uncompressed file
    wins over a .gz one of the same name (after `gunzip -k` both are there)."""
    if not os.path.isdir(source):
        raise UserError(
            f"MNIST source {source}: no such folder (pass a folder holding the four IDX files, or a URL)"
        )
    folders = [source, os.path.join(source, "MNIST", "raw")]
    found, missing = {}, []
    for name in ALL_FILES:
        candidates = [
            os.path.join(folder, spelling + suffix)
            for folder in folders
            for suffix in ("", ".gz")
            for spelling in _spellings(name)
        ]
        path = next((c for c in candidates if os.path.isfile(c)), None)
        if path is None:
            missing.append(name + "[.gz]")
            continue
        found[name] = (path, read_bytes(path))
    if missing:
        raise UserError(f"MNIST source {source}: no {', '.join(missing)} there")
    return found


def _download_mnist(base_url: str) -> dict[str, tuple[str, bytes]]:
    """name -> (url, raw bytes), trying the .gz name first as the public mirrors serve it."""
    base_url = base_url.rstrip("/") + "/"
    fetched = {}
    for name in ALL_FILES:
        urls = [base_url + spelling + suffix for spelling in _spellings(name) for suffix in (".gz", "")]
        first_reason = None
        for url in urls:
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    fetched[name] = (url, response.read())
                break
            except urllib.error.HTTPError as e:
                # The server answered: this spelling is not there; try the next one.
                first_reason = first_reason or str(e)
            except urllib.error.URLError as e:
                if not isinstance(e.reason, FileNotFoundError):
                    raise _download_error(url, e.reason) from None
                first_reason = first_reason or f"{e.reason.strerror}"
            except OSError as e:  # timeouts and resets while reading the body
                raise _download_error(url, e) from None
        else:
            raise _download_error(urls[0], first_reason)
    return fetched


def _download_error(url: str, reason) -> UserError:
    return UserError(
        f"could not download {url}: {reason}; copy the four files into a folder and pass it with --source"
    )
