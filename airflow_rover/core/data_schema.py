"""Which columns of a user's dataset the model reads, and how (``docs/data-formats.md``).

Part of the job's spec, so every process of a job reads the data the same way and the data
fingerprint covers it. Applies to the formats without a manifest (Parquet, TFRecord, CSV).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DATA_FORMATS = ("auto", "npy-columns", "parquet", "tfrecord", "csv")
DataFormat = Literal["auto", "npy-columns", "parquet", "tfrecord", "csv"]
DEFAULT_BUCKETS = 1 << 20
MAX_BUCKETS = 1 << 40
_COLUMN = r"^[^\s].*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Standardize(_Strict):
    """``(x - mean) / std``."""

    mean: float
    std: float = Field(gt=0)


class DenseColumn(_Strict):
    """A scalar numeric column read as one float32 dense feature."""

    name: str = Field(min_length=1, pattern=_COLUMN)
    normalize: Standardize | Literal["log1p"] | None = Field(
        default=None, description="{'mean': m, 'std': s}, or 'log1p' for counts; none: as is"
    )


class CategoricalColumnConfig(_Strict):
    """An int or string column, or a list of them, hashed into its table's buckets."""

    name: str = Field(min_length=1, pattern=_COLUMN)
    buckets: int | None = Field(
        default=None, gt=0, le=MAX_BUCKETS, description="default: the schema's default_buckets"
    )
    table: str | None = Field(
        default=None,
        min_length=1,
        pattern=r"^[A-Za-z_][\w-]*$",
        description="columns naming the same table share it; default: the column's name",
    )
    hashed: bool = Field(
        default=True,
        description="false: an int column's ids are used as they are (they must lie in "
        "[0, buckets)), as ids already indexed by the ETL",
    )
    raw: bool = Field(
        default=False,
        description="true: the values are keys of a table of index 'ids', never folded into "
        "buckets: ints as their int64 value, strings by their 64-bit hash (splitmix64 of "
        "FNV-1a); buckets is then only the expected count of distinct values. Scalar columns",
    )
    combiner: Literal["sum", "mean"] = Field(
        default="sum", description="how a list column's embeddings combine into one"
    )
    multivalued: bool | None = Field(
        default=None,
        description="true: a list column (any number of values per sample), as TFRecord "
        "features and CSV cells must be said to be; false: a scalar; none: as the files' "
        "type says (Parquet; a TFRecord feature whose first record holds other than one value)",
    )


class DataSchema(_Strict):
    """The label, the optional weight, the dense and the categorical columns of a dataset."""

    label: str = Field(default="label", min_length=1, pattern=_COLUMN)
    weight: str | None = Field(default=None, min_length=1, pattern=_COLUMN)
    dense: tuple[DenseColumn, ...] = ()
    categorical: tuple[CategoricalColumnConfig, ...] = ()
    default_buckets: int = Field(default=DEFAULT_BUCKETS, gt=0, le=MAX_BUCKETS)

    @model_validator(mode="after")
    def _consistent(self) -> DataSchema:
        names = [self.label, *([self.weight] if self.weight else [])]
        names += [c.name for c in self.dense] + [c.name for c in self.categorical]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"data_schema: columns {dupes} are named more than once")
        if not self.categorical:
            raise ValueError("data_schema.categorical: at least one column is needed")
        buckets: dict[str, int] = {}
        for column in self.categorical:
            table = self.table_of(column)
            size = self.buckets_of(column)
            if buckets.setdefault(table, size) != size:
                raise ValueError(
                    f"data_schema.categorical: table {table!r} is shared with different "
                    f"buckets ({buckets[table]} and {size} for column {column.name!r})"
                )
        return self

    def buckets_of(self, column: CategoricalColumnConfig) -> int:
        return column.buckets if column.buckets is not None else self.default_buckets

    @staticmethod
    def table_of(column: CategoricalColumnConfig) -> str:
        return column.table or column.name
