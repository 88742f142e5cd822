from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedlmc.data import load_dataset
from fedlmc.models import build_model
from fedlmc.strategies import OneShotAverage, StrategyOptions  # also PermutationAlignedAverage
from fedlmc.strategies.protocol import state_to_record

CLIENT_CONFIG = {"model": "mlp", "width": 0.5, "depth": 2, "base-hidden": 64, "epochs": 2}
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    splits = load_dataset("mnist5k")  # the server split is held out of the clients' pool
    template = build_model("mlp", width=0.5, depth=2, base_hidden=64)  # the clients' model
    options = StrategyOptions(  # also taken by PermutationAlignedAverage and FedAvgBaseline
        num_clients=2, min_clients=2, calibration="server", server_data=splits.server
    )
    strategy = OneShotAverage(template, options)
    result = strategy.start(
        grid=grid,
        initial_arrays=state_to_record(template.state_dict()),
        num_rounds=1,
        train_config=ConfigRecord(CLIENT_CONFIG),
    )  # a OneShotResult: Flower's Result records (arrays, train_metrics_clientapp) + details
    merged = result.merged_state  # merged (BN-re-estimated) weights, as in result.arrays
    print("temperature", result.temperature, "survivors", result.report.survivor_ids)
    print("merged tensors", len(merged), "merge seconds", round(result.merge_seconds, 3))


if __name__ == "__main__":  # or point [tool.flwr.app.components] serverapp at this module
    from flwr.simulation import run_simulation

    from fedlmc.simulations.client_app import app as client_app

    run_simulation(
        server_app=app,
        client_app=client_app,
        num_supernodes=2,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
