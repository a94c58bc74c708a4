"""TensorBoard scalar summaries without TensorFlow or torch.

Both runners (and the emulator runs) write the same event files through this writer, so
``tensorboard --logdir model_dir`` shows CPU and emulator runs of either framework alike.
An event file is a TFRecord stream of ``Event`` protos: per record, the length (uint64
little-endian), its masked CRC32C, the data, and the data's masked CRC32C.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
# The CRC from tensorboard's TensorFlow-free stub: importing it does not import TensorFlow.
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c


class ScalarWriter:
    """Appends scalars to a new event file in ``logdir`` (``model_dir/train`` or ``model_dir/eval``)."""

    def __init__(self, logdir: str):
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}.{id(self)}"
        self.path = os.path.join(logdir, name)
        # unbuffered: each record reaches the file whole in write(), or not at all (below)
        self._file = open(self.path, "ab", buffering=0)
        self._size = 0
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event: event_pb2.Event) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        record = memoryview(header + struct.pack("<I", masked_crc32c(header)) + data
                            + struct.pack("<I", masked_crc32c(data)))
        try:
            while record:  # a nearly full disk takes part of a write
                record = record[self._file.write(record):]
        except OSError as e:
            # a full disk midway: cut the record off, so that the file ends on the last whole one
            with contextlib.suppress(OSError):
                self._file.truncate(self._size)
            e.filename = e.filename or self.path
            raise
        self._size += len(record.obj)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(v))
                                             for tag, v in values.items()])
        self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """Read every scalar in the event files of ``logdir``: {tag: [(step, value), ...]} (for tests and tools)."""
    result: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(os.listdir(logdir)):
        if not name.startswith("events.out.tfevents"):
            continue
        with open(os.path.join(logdir, name), "rb") as f:
            data = f.read()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            record = data[pos + 12:pos + 12 + length]
            end = pos + 12 + length + 4
            if end > len(data) or struct.unpack("<I", data[end - 4:end])[0] != masked_crc32c(record):
                break  # a record cut short (a write that never finished) or damaged: not read as whole
            pos = end
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                result.setdefault(value.tag, []).append((event.step, value.simple_value))
    return result
