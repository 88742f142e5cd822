"""Train two MLPs on disjoint halves of the embedded digits, merge them plain and aligned."""

import torch

from fedlmc import (
    apply_permutation,
    average,
    barriers,
    build_model,
    evaluate,
    fit_temperature,
    interpolation_curve,
    load_dataset,
    load_state,
    partition,
    permutation_spec,
    predict_logits,
    train_model,
    weight_matching,
)
from fedlmc.analysis import lewc_cosine

splits = load_dataset("mnist5k")  # 3,600 train / 400 server / 1,000 test real digits
clients = partition(splits.train, num_clients=2, scheme="iid", seed=0)

models = []
for i, data in enumerate(clients):
    torch.manual_seed(i)  # independent initialisation per client
    model = build_model("mlp", width=4)  # 3 hidden layers of 512 units
    train_model(model, data, epochs=10, lr=0.05, weight_decay=3e-3, batch_size=128, seed=i)
    models.append(model)

sd_a, sd_b = (m.state_dict() for m in models)
spec = permutation_spec(models[0])
sd_b_aligned = apply_permutation(spec, weight_matching(spec, sd_a, sd_b), sd_b)
template = build_model("mlp", width=4)

for name, b in [("plain average", sd_b), ("weight matching", sd_b_aligned)]:
    merged = load_state(template, average([sd_a, b]))
    x_server, y_server = splits.server
    t = fit_temperature(predict_logits(merged, x_server), y_server)
    raw, cal = evaluate(merged, splits.test), evaluate(merged, splits.test, temperature=t)
    curve = interpolation_curve(
        template, sd_a, b, splits.test, lambdas=11, calibration=splits.server
    )
    bar = barriers(curve)
    lewc = lewc_cosine(template, [sd_a, b], [0.5, 0.5], average([sd_a, b]), splits.test[0][:512])
    print(
        f"{name:16s} acc {raw['accuracy']:.3f}  NLL {raw['nll']:.3f} -> {cal['nll']:.3f}"
        f" (T={t:.2f})  ECE {raw['ece']:.3f} -> {cal['ece']:.3f}"
        f"  max loss barrier {bar['loss_barrier']:.3f}"
        f" -> {bar['loss_barrier_calibrated']:.3f}  LEWC cos {[round(c, 2) for c in lewc]}"
    )
print("endpoints        acc", [round(evaluate(m, splits.test)["accuracy"], 3) for m in models])
