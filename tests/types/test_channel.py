"""The mp wire format: plain-pickle headers plus raw tensor frames read straight into a
new tensor."""

from __future__ import annotations

import multiprocessing

import torch

from diffserve.types.channel import PipeChannel, queue_channel_pair
from diffserve.types.messages import Command, Reply
from diffserve.types.results import RequestResult


def test_result_tensors_travel_as_frames_and_arrive_intact() -> None:
    a, b = multiprocessing.get_context("spawn").Pipe(duplex=True)
    parent, worker = PipeChannel(a), PipeChannel(b)
    images = torch.randint(0, 256, (2, 16, 16, 3), dtype=torch.uint8)
    floats = torch.rand(1, 3, 8, 8, dtype=torch.float32)
    halves = torch.rand(1, 4, 64, dtype=torch.bfloat16)
    outputs = [
        RequestResult(f"r{i}", t, [i], {"denoise": 1.0}, {"batch_size": 3})
        for i, t in enumerate((images, floats, halves))
    ]
    worker.send(Reply("result", 7, 0, value=outputs))
    got = parent.recv()
    assert got.kind == "result" and got.call_id == 7
    for sent, received in zip(outputs, got.value, strict=True):
        assert received.request_id == sent.request_id and received.seeds == sent.seeds
        assert received.images.dtype == sent.images.dtype and torch.equal(
            received.images, sent.images
        )
        # The receiver owns its copy.
        assert received.images.data_ptr() != sent.images.data_ptr()
    # Other messages are ordinary pickles, and the channel keeps working after frames.
    parent.send(Command("rpc", call_id=8, method="ping"))
    assert worker.poll(5) and worker.recv().method == "ping"
    parent.close()
    worker.close()


def test_queue_channel_passes_objects_by_reference_and_reports_close() -> None:
    import pytest

    from diffserve.types.channel import ChannelClosed

    parent, worker = queue_channel_pair()
    payload = torch.zeros(4)
    worker.send(Reply("result", 1, 0, value=payload))
    assert parent.poll(1) and parent.recv().value is payload
    assert not parent.poll(0)
    worker.close()
    with pytest.raises(ChannelClosed):
        parent.recv()
    with pytest.raises(ChannelClosed):
        parent.recv()
