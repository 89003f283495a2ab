"""The one object that knows the mesh: degrees ``pp × dp_replicate × dp_shard × tp``.

Vocabulary: a *dim* is one named axis of the world mesh ("pp", "dp_replicate", "dp_shard", "tp");
a *mesh* is a DeviceMesh over one or more dims. One flattened dim is derived: "dp"
(dp_replicate × dp_shard, the ranks that read different data); FSDP takes the
(dp_replicate, dp_shard) sub-mesh directly. No other code multiplies degrees; ask this object.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from tasks.errors import UserError
from tasks.train.config import ParallelConfig

DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass
class ParallelDims:
    """Degrees of each dim, validated against the world size at construction.

    ``dp_shard = -1`` takes whatever the other degrees leave of the world.
    """

    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    world_size: int
    _mesh: DeviceMesh | None = field(default=None, init=False, repr=False)
    _dp_mesh: DeviceMesh | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in DIM_NAMES:
            value = getattr(self, name)
            if value < 1 and not (name == "dp_shard" and value == -1):
                raise UserError(f"parallel.{name} must be a positive integer (dp_shard may be -1), got {value}")
        others = self.pp * self.dp_replicate * self.tp
        if self.dp_shard == -1:
            if self.world_size % others:
                raise UserError(
                    f"world size {self.world_size} is not divisible by pp×dp_replicate×tp = {others}; "
                    "change the number of processes or the parallel degrees"
                )
            self.dp_shard = self.world_size // others
        if others * self.dp_shard != self.world_size:
            raise UserError(
                f"parallel degrees pp={self.pp} × dp_replicate={self.dp_replicate} × dp_shard={self.dp_shard} × "
                f"tp={self.tp} = {others * self.dp_shard} do not match the world size {self.world_size}; "
                "set parallel.dp_shard = -1 or launch that many processes"
            )

    @classmethod
    def from_config(cls, cfg: ParallelConfig, world_size: int) -> "ParallelDims":
        return cls(pp=cfg.pp, dp_replicate=cfg.dp_replicate, dp_shard=cfg.dp_shard, tp=cfg.tp, world_size=world_size)

    # -- what is on ---------------------------------------------------------------------------

    @property
    def dp_size(self) -> int:
        """Ranks that read different data: the data loader's world."""
        return self.dp_replicate * self.dp_shard

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp_size > 1

    @property
    def fsdp_enabled(self) -> bool:
        """FSDP also covers pure replication (dp_shard = 1, dp_replicate > 1) as HSDP with shard size 1."""
        return self.dp_enabled

    @property
    def hsdp_enabled(self) -> bool:
        return self.dp_replicate > 1

    def describe(self) -> str:
        return " × ".join(f"{name}={getattr(self, name)}" for name in DIM_NAMES)

    # -- meshes ---------------------------------------------------------------------------------

    @property
    def mesh(self) -> DeviceMesh:
        if self._mesh is None:
            raise RuntimeError("ParallelDims.build_mesh(device_type) must be called before using meshes")
        return self._mesh

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The world mesh with every dim named (degree-1 dims included, so names always resolve),
        plus the flattened "dp" mesh. Needs an initialised default process group."""
        if self._mesh is None:
            shape = tuple(getattr(self, name) for name in DIM_NAMES)
            mesh = init_device_mesh(device_type, shape, mesh_dim_names=DIM_NAMES)
            # Kept here: slicing a flattened dim back out of the root mesh is deprecated.
            self._dp_mesh = mesh["dp_replicate", "dp_shard"]._flatten(mesh_dim_name="dp")
            self._mesh = mesh
        return self._mesh

    def fsdp_mesh(self) -> DeviceMesh:
        """The mesh FSDP shards over: (dp_replicate, dp_shard) for HSDP, else dp_shard."""
        return self.mesh["dp_replicate", "dp_shard"] if self.hsdp_enabled else self.mesh["dp_shard"]

    def dp_mesh(self) -> DeviceMesh:
        """The flattened (dp_replicate × dp_shard) mesh: the ranks that read different data."""
        self.mesh  # raises if not built
        return self._dp_mesh

    @property
    def dp_rank(self) -> int:
        return self.dp_mesh().get_local_rank()

    @property
    def pp_rank(self) -> int:
        return self.mesh["pp"].get_local_rank()

    @property
    def tp_rank(self) -> int:
        return self.mesh["tp"].get_local_rank()
