"""fedlmc.data.augment: the batched crop-and-flip equals hand-computed crops, is a shifted and
possibly mirrored copy of each image, is deterministic for a seeded generator, and refuses an
unknown name or a batch that is not images."""

from __future__ import annotations

import pytest
import torch

from fedlmc.data.augment import AUGMENTATIONS, apply_augment, check_augment, crop_flip, crop_flip_at


def test_crop_flip_at_matches_hand_computed_crops():
    x = torch.arange(1.0, 10.0).reshape(1, 1, 3, 3)  # [[1,2,3],[4,5,6],[7,8,9]]
    zero = torch.tensor([0])
    two = torch.tensor([2])
    no, yes = torch.tensor([False]), torch.tensor([True])
    top_left = crop_flip_at(x, zero, zero, no, padding=1)
    assert top_left[0, 0].tolist() == [[0, 0, 0], [0, 1, 2], [0, 4, 5]]
    flipped = crop_flip_at(x, zero, zero, yes, padding=1)
    assert flipped[0, 0].tolist() == [[0, 0, 0], [2, 1, 0], [5, 4, 0]]
    bottom_right = crop_flip_at(x, two, two, no, padding=1)
    assert bottom_right[0, 0].tolist() == [[5, 6, 0], [8, 9, 0], [0, 0, 0]]
    centre_flip = crop_flip_at(x, torch.tensor([1]), torch.tensor([1]), yes, padding=1)
    assert torch.equal(centre_flip, x.flip(-1))


def test_crop_flip_keeps_shape_and_is_deterministic_for_a_seed():
    x = torch.randn(16, 3, 8, 8)
    a = crop_flip(x, torch.Generator().manual_seed(5))
    b = crop_flip(x, torch.Generator().manual_seed(5))
    c = crop_flip(x, torch.Generator().manual_seed(6))
    assert a.shape == x.shape and a.dtype == x.dtype
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(apply_augment(None, x), x)


def test_crop_flip_output_is_a_shifted_possibly_flipped_copy_of_each_image():
    x = torch.rand(32, 2, 6, 6) + 1.0  # strictly positive, so padding zeros are recognisable
    out = crop_flip(x, torch.Generator().manual_seed(0), padding=4)
    candidates = {
        (dy, dx, f): crop_flip_at(
            x, torch.full((32,), dy), torch.full((32,), dx), torch.full((32,), f), padding=4
        )
        for dy in range(9)
        for dx in range(9)
        for f in (False, True)
    }
    found = [
        next(key for key, cand in candidates.items() if torch.equal(cand[b], out[b]))
        for b in range(32)
    ]
    assert any(f for _, _, f in found) and not all(f for _, _, f in found)
    assert any((dy, dx) != (4, 4) for dy, dx, _ in found)


def test_augment_rejects_unknown_name_and_non_image_batches():
    with pytest.raises(ValueError, match="blur"):
        apply_augment("blur", torch.zeros(2, 1, 4, 4))
    with pytest.raises(ValueError, match=r"\(2, 16\)"):
        crop_flip(torch.zeros(2, 16))


def test_every_declared_augmentation_is_accepted_and_none_is_the_identity():
    check_augment(None)
    x = torch.rand(4, 3, 8, 8)
    for name in AUGMENTATIONS:
        check_augment(name)
        assert apply_augment(name, x, torch.Generator().manual_seed(0)).shape == x.shape
