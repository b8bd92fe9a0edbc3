"""Device-to-host copies of a snapshot's gated CUDA tensors, on a side stream.

A gated CUDA tensor (a parameter or optimizer state on the GPU) cannot be written to a file from
its own memory: it needs a host copy. `CudaStage` makes it in pinned host buffers reused from
save to save, on its own CUDA stream, so the host thread does not wait for it at all. The side
stream first waits for the current (compute) stream, so the copy sees every kernel queued before
the save; the optimizer gate then makes the compute stream wait for the copy's event before the
optimizer's kernels (`Gate`, `runtime/checkpoint/chunked.py`), so forward and backward overlap the copy and
`step()` never blocks the host for it. The drain waits for the event and writes the host copies.

Written without a GPU to run it on: the CPU paths are what the tests here exercise; the CUDA
tests (tests/runtime/checkpoint/test_gated_snapshot.py) run where CUDA exists.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CudaStage"]


class CudaStage:
    """Pinned host buffers, one per staged tensor position, and the side stream that fills them."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []
        self._stream: Any = None

    @property
    def nbytes(self) -> int:
        return sum(b.element_size() * b.nelement() for b in self.buffers)

    @staticmethod
    def bytes_for(tensors: list[torch.Tensor]) -> int:
        return sum(t.element_size() * t.nelement() for t in tensors)

    def clear(self) -> None:
        self.buffers = []

    def stage(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
        """Host copies of `tensors` (queued, not done) and the CUDA event that completes them."""
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        side = self._stream
        side.wait_stream(torch.cuda.current_stream())  # after every kernel queued before the save
        out: list[torch.Tensor] = []
        with torch.cuda.stream(side):
            for i, t in enumerate(tensors):
                buf = self.buffers[i] if i < len(self.buffers) else None
                if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    if i < len(self.buffers):
                        self.buffers[i] = buf
                    else:
                        self.buffers.append(buf)
                buf.copy_(t, non_blocking=True)
                t.record_stream(side)  # its memory is not reused before the copy is done
                out.append(buf)
        del self.buffers[len(tensors) :]
        event = torch.cuda.Event()
        event.record(side)
        return out, event
