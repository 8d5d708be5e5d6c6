"""``History``: the metrics of a training run, one record per logged step and per evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["History"]


@dataclass
class History:
    """The metrics of a run: ``records`` is a list of dicts, one per logged step (and per evaluation).

    Keys: ``step``, ``loss`` (training, mean per token over the step), ``lr``, ``tokens_per_s``,
    ``mfu`` (CUDA only), ``elapsed_s``; evaluation records have ``val_loss``. ``stop_reason`` is
    ``"steps"`` or ``"max_seconds"`` after ``fit``.
    """

    records: list[dict] = field(default_factory=list)
    stop_reason: str | None = None

    def log(self, **values) -> None:
        self.records.append(values)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of every record that has ``key``."""
        rows = [r for r in self.records if r.get(key) is not None]
        return [r["step"] for r in rows], [r[key] for r in rows]

    def last(self, key: str):
        """The most recent value of ``key`` (None if never logged)."""
        values = self.series(key)[1]
        return values[-1] if values else None

    def plot(self, ax=None, title: str | None = None):
        """Training loss (line) and validation loss (dots) against the step; returns the matplotlib Axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots()
        steps, loss = self.series("loss")
        if steps:
            ax.plot(steps, loss, label="train", lw=1.2)
        steps, val = self.series("val_loss")
        if steps:
            ax.plot(steps, val, "o-", label="validation", ms=4)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats / token)")
        ax.legend()
        if title:
            ax.set_title(title)
        return ax

    def to_dict(self) -> dict:
        return {"records": self.records, "stop_reason": self.stop_reason}

    @classmethod
    def from_dict(cls, data: dict) -> History:
        return cls(records=[dict(r) for r in data["records"]], stop_reason=data.get("stop_reason"))

    def __repr__(self) -> str:
        return (f"History({len(self.records)} records, last loss={self.last('loss')}, "
                f"last val_loss={self.last('val_loss')}, stop_reason={self.stop_reason})")

