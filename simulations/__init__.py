"""Flower ClientApp/ServerApp, simulation driver, sweeps, reports and the command line."""
