"""Tests of fedlmc.train on tiny models and data (seconds on 2 CPU cores)."""

from __future__ import annotations

import copy
import itertools
import random

import numpy as np
import pytest
import torch
from torch import nn

from fedlmc.evaluation import evaluate
from fedlmc.train import NonFiniteLossError, TrainHistory, seed_everything, train_model

TRAIN_ARGS = dict(epochs=4, lr=0.1, weight_decay=1e-4, batch_size=32)


def linear_task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three classes given by the argmax of a fixed linear map of 2x4x4 images (learnable)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, 4, 4, generator=g)
    w = torch.randn(32, 3, generator=torch.Generator().manual_seed(1234))
    return x, (x.flatten(1) @ w).argmax(dim=1)


def mlp(seed: int, norm: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    norm_layer = nn.BatchNorm1d(24) if norm else nn.Identity()
    return nn.Sequential(nn.Flatten(), nn.Linear(32, 24), norm_layer, nn.ReLU(), nn.Linear(24, 3))


def tiny_cnn(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3)
    )


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def test_training_reduces_loss_and_beats_chance_on_synthetic_task():
    model, history = train_model(mlp(0), linear_task(600, 0), **TRAIN_ARGS)
    assert isinstance(history, TrainHistory)
    assert len(history.loss) == len(history.accuracy) == 4
    assert history.loss[-1] < 0.6 * history.loss[0]
    assert history.samples == 4 * 600 and history.seconds > 0
    assert not model.training
    assert evaluate(model, linear_task(400, 1))["accuracy"] > 0.75  # chance is about 1/3


def test_training_beats_chance_on_real_digits():
    from fedlmc.data.loading import load_dataset

    splits = load_dataset("mnist5k")
    x, y = splits.train[0][:400], splits.train[1][:400]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
    model, history = train_model(model, (x, y), epochs=5, lr=0.05, weight_decay=1e-4, batch_size=32)
    assert history.loss[-1] < 0.5 * history.loss[0]
    test = (splits.test[0][:300], splits.test[1][:300])
    assert evaluate(model, test)["accuracy"] > 0.6  # chance is 0.1


@pytest.mark.parametrize(
    ("optimizer", "schedule", "lr"),
    [
        (o, s, 0.1 if o == "sgd" else 0.01)
        for o, s in itertools.product(["sgd", "adam", "adamw"], ["onecycle", "cosine", "constant"])
    ],
)
def test_every_optimizer_and_schedule_learns(optimizer, schedule, lr):
    args = dict(TRAIN_ARGS, lr=lr, optimizer=optimizer, schedule=schedule, epochs=3)
    _, history = train_model(mlp(0), linear_task(300, 0), **args)
    assert history.loss[-1] < history.loss[0]


def test_same_seed_gives_bitwise_identical_weights_and_different_seed_differs():
    data = linear_task(200, 0)
    a, hist_a = train_model(mlp(0), data, seed=3, **TRAIN_ARGS)
    b, hist_b = train_model(mlp(0), data, seed=3, **TRAIN_ARGS)
    c, _ = train_model(mlp(0), data, seed=4, **TRAIN_ARGS)
    assert all(torch.equal(p, q) for p, q in zip(weights(a), weights(b), strict=True))
    assert hist_a.loss == hist_b.loss and hist_a.accuracy == hist_b.accuracy
    assert not all(torch.equal(p, q) for p, q in zip(weights(a), weights(c), strict=True))


def test_augmented_training_is_deterministic_for_a_seed():
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(96, 3, 8, 8, generator=g), torch.randint(0, 3, (96,), generator=g))
    args = dict(TRAIN_ARGS, epochs=2, augment="crop_flip")
    a, _ = train_model(tiny_cnn(0), data, seed=1, **args)
    b, _ = train_model(tiny_cnn(0), data, seed=1, **args)
    c, _ = train_model(tiny_cnn(0), data, seed=1, **dict(args, augment=None))
    assert all(torch.equal(p, q) for p, q in zip(weights(a), weights(b), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(weights(a), weights(c), strict=True))


def test_train_model_does_not_modify_the_data():
    x, y = linear_task(100, 0)
    x0, y0 = x.clone(), y.clone()
    train_model(mlp(0), (x, y), **TRAIN_ARGS)
    assert torch.equal(x, x0) and torch.equal(y, y0)


def test_huge_learning_rate_raises_non_finite_loss_error():
    with pytest.raises(NonFiniteLossError, match=r"epoch \d+, batch \d+"):
        train_model(mlp(0), linear_task(200, 0), **dict(TRAIN_ARGS, lr=1e30, schedule="constant"))


def test_infinite_input_raises_at_its_batch():
    x, y = linear_task(64, 0)
    x[0, 0, 0, 0] = float("inf")
    with pytest.raises(NonFiniteLossError, match=r"(nan|inf) at epoch 0, batch 0") as info:
        train_model(mlp(0), (x, y), **dict(TRAIN_ARGS, batch_size=64))
    assert isinstance(info.value, FloatingPointError)


def test_non_finite_loss_is_caught_in_a_later_batch_of_a_long_epoch():
    x, y = linear_task(200, 0)
    x[150] = float("nan")
    # batch_size 1: the failing batch is the position of sample 150 in the seed-0 permutation
    with pytest.raises(NonFiniteLossError, match=r"nan at epoch 0, batch (\d+)") as info:
        train_model(mlp(0), (x, y), **dict(TRAIN_ARGS, batch_size=1, schedule="constant"))
    batch = int(info.value.args[0].rsplit(" ", 1)[1])
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(0))
    assert batch == int((perm == 150).nonzero()[0, 0])


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"epochs": 0}, "epochs"),
        ({"lr": 0.0}, "lr"),
        ({"lr": -1.0}, "lr"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"batch_size": 0}, "batch_size"),
        ({"optimizer": "rmsprop"}, "rmsprop"),
        ({"schedule": "step"}, "step"),
        ({"augment": "cutout"}, "cutout"),
        ({"momentum": 1.5}, "momentum"),
        ({"lr": "0.1"}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"epochs": 2.0}, "epochs"),
    ],
)
def test_invalid_arguments_raise_value_error_naming_the_value(override, named):
    value = str(next(iter(override.values())))
    with pytest.raises(ValueError, match=named) as info:
        train_model(mlp(0), linear_task(10, 0), **dict(TRAIN_ARGS, **override))
    message = str(info.value)
    assert value in message and "\n" not in message


def test_one_full_batch_of_plain_sgd_is_one_gradient_step_with_weight_decay():
    x, y = linear_task(50, 0)
    model = mlp(0)
    reference = copy.deepcopy(model)
    lr, wd = 0.3, 0.01
    args = dict(epochs=1, lr=lr, weight_decay=wd, batch_size=50, momentum=0.0)
    train_model(model, (x, y), schedule="constant", **args)
    loss = torch.nn.functional.cross_entropy(reference(x), y)
    grads = torch.autograd.grad(loss, list(reference.parameters()))
    for p, p0, g in zip(model.parameters(), reference.parameters(), grads, strict=True):
        torch.testing.assert_close(p.detach(), p0.detach() - lr * (g + wd * p0.detach()))


def test_amp_is_a_no_op_on_the_cpu_and_progress_bar_shows_the_loss(capsys):
    data = linear_task(64, 0)
    a, _ = train_model(mlp(0), data, device="cpu", **TRAIN_ARGS)
    b, _ = train_model(mlp(0), data, device="cpu", amp=True, progress=True, **TRAIN_ARGS)
    assert all(torch.equal(p, q) for p, q in zip(weights(a), weights(b), strict=True))
    assert "loss=" in capsys.readouterr().err


def test_mismatched_data_lengths_raise():
    x, y = linear_task(10, 0)
    with pytest.raises(ValueError, match="same non-zero length"):
        train_model(mlp(0), (x, y[:5]), **TRAIN_ARGS)


def test_batchnorm_model_drops_a_single_sample_last_batch_only():
    data = linear_task(65, 0)
    _, with_bn = train_model(mlp(0, norm=True), data, **dict(TRAIN_ARGS, batch_size=32))
    _, without_bn = train_model(mlp(0), data, **dict(TRAIN_ARGS, batch_size=32))
    assert with_bn.samples == 4 * 64
    assert without_bn.samples == 4 * 65
    _, partial_bn = train_model(mlp(0, norm=True), linear_task(66, 0), **TRAIN_ARGS)
    assert partial_bn.samples == 4 * 66
    with pytest.raises(ValueError, match="at least 2 training samples, got 1"):
        train_model(mlp(0, norm=True), linear_task(1, 0), **TRAIN_ARGS)


def test_seed_everything_repeats_global_random_draws():
    seed_everything(7)
    first = (torch.rand(3), np.random.rand(), random.random())
    seed_everything(7)
    second = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(first[0], second[0]) and first[1:] == second[1:]


def test_model_is_trained_in_place_and_returned():
    model = mlp(0)
    before = copy.deepcopy(model)
    trained, _ = train_model(model, linear_task(64, 0), **TRAIN_ARGS)
    assert trained is model
    assert not torch.equal(before[1].weight, model[1].weight)


def test_held_out_loss_per_epoch_leaves_training_bit_identical():
    """The per-epoch held-out loss (BatchNorm model: eval mode, running statistics) changes no
    weight, running statistic or random draw; the last value is the trained model's loss."""
    data, held = linear_task(200, 0), linear_task(50, 1)
    plain, plain_history = train_model(mlp(0, norm=True), data, **TRAIN_ARGS)
    model, history = train_model(mlp(0, norm=True), data, **TRAIN_ARGS, held_out=held)
    assert all(torch.equal(a, b) for a, b in zip(weights(plain), weights(model), strict=True))
    assert history.loss == plain_history.loss and plain_history.held_out_loss == []
    assert len(history.held_out_loss) == 4 and history.held_out_seconds > 0
    with torch.no_grad():
        expected = float(nn.functional.cross_entropy(model.eval()(held[0]), held[1]))
    assert history.held_out_loss[-1] == pytest.approx(expected, rel=1e-6)
    assert history.held_out_loss[0] != pytest.approx(history.held_out_loss[-1])
