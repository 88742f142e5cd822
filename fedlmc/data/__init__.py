"""Data: the data sets as in-memory tensors, their held-out splits and the clients' partitions.

- :mod:`fedlmc.data.catalog`: the data-set registry (:func:`register_dataset`), importable
  without torch (config validation).
- :mod:`fedlmc.data.loading`: :func:`load_dataset` and :func:`from_arrays`.
- :mod:`fedlmc.data.splits`: :class:`DataSplits` and the stratified server split.
- :mod:`fedlmc.data.partitions`: IID, Dirichlet and pathological partitions (flwr-datasets).
- :mod:`fedlmc.data.download`, :mod:`fedlmc.data.hf`: torchvision files and Hugging Face data;
  :mod:`fedlmc.data.cifar_files`: CIFAR batches that fail the md5, read without running code.
- :mod:`fedlmc.data.augment`: batched augmentation.
"""

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["load_dataset", "from_arrays", "cache_dir", "NORMALISATION"], ".loading"),
    **dict.fromkeys(["Data", "DataSplits", "stratified_split", "with_server_split"], ".splits"),
    **dict.fromkeys(
        ["partition", "partition_indices", "label_counts", "label_skew"]
        + ["plot_label_distribution", "PARTITION_SCHEMES"],
        ".partitions",
    ),
    **dict.fromkeys(
        ["DATASETS", "DOWNLOADABLE", "NUM_CLASSES", "TRAIN_SIZES", "IN_SHAPES"]
        + ["check_dataset_name", "is_hf_name", "register_dataset", "dataset_entry"],
        ".catalog",
    ),
    **dict.fromkeys(
        ["fetch_dataset", "ChecksumError", "DownloadError", "FetchResult"], ".download"
    ),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
