"""``Data``: a dataset object with its own ``setup``, given to ``ModelTrainer(MyModel, data=MyData)``.

``setup(config)`` returns the splits, ``{"train": ..., "valid": ...}``: a Ray Data ``Dataset`` (with
``ScalingConfig(executor="ray")``), a pandas DataFrame, a dict of numpy arrays, a pyarrow Table, a
list of rows, or a torch map-style ``Dataset``. It runs where the run runs, once per run, with the
run's config (the model's): in this process for ``fit()``, on the train server for a submitted job,
once per trial in Tune. Each worker then gets its own share of ``"train"`` (the core's split: contiguous
parts, or Ray Data's ``streaming_split``; a torch ``Dataset`` given to a PyTorch model is split by a
``DistributedSampler`` instead, read lazily) and the other splits whole (XGBoost, which sums its
evaluation metrics over the workers, gets every split divided).

``label_column`` names the label's column of tabular splits: what the GBDT and Keras models learn to
predict, and for a PyTorch model the second element of its ``(features, label)`` batches (the other
columns stacked into one float32 tensor, or the only other column as it is).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

TRAIN = "train"
VALID = "valid"


class Data:
    """Subclass it and write ``setup(config)``.

    Example::

        class DigitsData(Data):
            label_column = "label"

            def setup(self, config):
                x, y = sklearn.datasets.load_digits(return_X_y=True)
                frame = pd.DataFrame(x / 16.0).rename(columns=str).assign(label=y)
                return {"train": frame.iloc[:1500], "valid": frame.iloc[1500:]}

        ModelTrainer(DigitsNet, data=DigitsData, config={"lr": 1e-3}).fit()

    Pass the class (built with no arguments) or an instance (``DigitsData(path=...)``, with an
    ``__init__`` of your own).
    """

    label_column: ClassVar[str | None] = None

    def setup(self, config: dict[str, Any]) -> dict[str, Any]:
        """The splits: ``{"train": ..., "valid": ...}`` (see the module docstring for the types)."""
        raise NotImplementedError(
            f"{type(self).__name__}.setup(config) is not implemented: return {{'train': ..., 'valid': ...}}."
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def check_data(data: Any, who: str) -> None:
    """TypeError unless ``data`` is None, a ``Data`` subclass or a ``Data`` instance with ``setup``."""
    if data is None:
        return
    cls = data if inspect.isclass(data) else type(data)
    if not (inspect.isclass(cls) and issubclass(cls, Data)) or cls is Data:
        shown = data.__qualname__ if inspect.isclass(data) else f"a {type(data).__qualname__}"
        raise TypeError(
            f"{who}(data={shown}): it is not a trainforge.model.Data subclass (or an instance of one); write "
            "class MyData(Data) whose setup(config) returns {'train': ..., 'valid': ...} and pass it."
        )
    if cls.setup is Data.setup:
        raise TypeError(f"{who}(data={cls.__qualname__}): it does not implement setup(config).")


def data_splits(data: Any, config: dict[str, Any], allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    """``data.setup(config)`` (``data`` a Data class or instance), checked: a dict of named splits with
    ``"train"``, and when ``allowed`` is given, no other names."""
    obj: Any = data() if inspect.isclass(data) else data
    name = type(obj).__qualname__
    splits = obj.setup(dict(config))
    if not isinstance(splits, dict) or not all(isinstance(k, str) for k in splits):
        raise ValueError(f"{name}.setup(config) returned {type(splits).__name__}: return a dict such as "
                         "{'train': ..., 'valid': ...}")  # fmt: skip
    if TRAIN not in splits or splits[TRAIN] is None:
        raise ValueError(f"{name}.setup(config) returned the splits {sorted(splits)}: a 'train' split is needed")
    if allowed is not None and set(splits) - set(allowed):
        raise ValueError(
            f"{name}.setup(config) returned the splits {sorted(splits)}: this model trains on {list(allowed)} "
            "only (name the validation split 'valid')"
        )
    return {k: v for k, v in splits.items() if v is not None}


def label_column(data: Any) -> str | None:
    """The ``label_column`` of a Data class or instance (None without data)."""
    if data is None:
        return None
    value = getattr(data, "label_column", None)
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{data!r}.label_column={value!r}: give the label column's name (a str) or None")
    return value


def is_torch_dataset(value: Any) -> bool:
    """A torch map-style ``Dataset`` (checked without importing torch)."""
    import sys

    data = sys.modules.get("torch.utils.data")
    return data is not None and isinstance(value, data.Dataset) and not isinstance(value, data.IterableDataset)
