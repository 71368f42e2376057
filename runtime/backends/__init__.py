"""Training backends: one interface, implementations found by name through the entry-point
group ``model_platform.backends`` (see pyproject.toml), so a third backend is a package of its
own that declares an entry point, not a patch of this one.

A backend trains in a job's work directory (``runtime.spec``), resuming from ``checkpoint/``
when one is there, writes the best weights to ``best/``, exports an inference artifact with its
manifest, and loads such an artifact for inference. Events go through ``emit``.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.kinds import GENERATIVE_KINDS
from runtime.spec import JobSpec

if TYPE_CHECKING:  # both import Emit from here
    from runtime.llm import LLMOps
    from runtime.loop import ModelOps

ENTRY_POINT_GROUP = "model_platform.backends"

# emit(kind, **data): kind is one of "state", "progress", "loss", "metrics", "log", "checkpoint",
# "resumed"; the runner turns each into a structured event line.
Emit = Callable[..., None]


class BackendNotFound(LookupError):
    pass


class Backend(ABC):
    name: str = ""
    # The runtime its exports run on: "paddle_inference", "onnxruntime"…
    runtime: str = ""
    # The runtime its generative exports run on: "paddle_generate", "torch_generate".
    generative_runtime: str = ""

    @abstractmethod
    def train(self, spec: JobSpec, workdir: Path, emit: Emit) -> dict[str, Any] | None:
        """Train on ``workdir/data``; checkpoints in ``workdir/checkpoint`` (resume from it if
        present), the best weights, config and vocab.txt in ``workdir/best``. Returns the
        training state (best metric, history…) where the backend keeps one."""

    @abstractmethod
    def export(self, spec: JobSpec, workdir: Path, out_dir: Path) -> dict[str, str]:
        """Write the inference artifact of ``workdir/best`` into ``out_dir``: model files and
        vocab.txt. Returns the manifest's fields that name them (``model_file``, and
        ``params_file`` where the runtime has one); the runner writes the manifest."""

    def load_for_inference(self, export_dir: Path, device: str = "cpu") -> Any:
        """A ``runtime.inference.Predictor`` over an exported artifact."""
        from runtime.inference import Predictor

        return Predictor.load(export_dir, device=device)


class LoopBackend(Backend):
    """A backend over the platform's own training loops: ``runtime.loop`` trains the
    classifiers, ``runtime.llm`` the generative kinds (and exports them); the framework gives
    the ops each loop drives and the classifiers' export."""

    @abstractmethod
    def model_ops(self) -> "ModelOps":
        """The ops ``runtime.loop`` trains a classifier with."""

    @abstractmethod
    def llm_ops(self) -> "LLMOps":
        """The ops ``runtime.llm`` trains (and exports) a generative model with."""

    @abstractmethod
    def export_classifier(self, spec: JobSpec, workdir: Path, out_dir: Path) -> dict[str, str]:
        """``export`` for a classifier."""

    def mlm_ops(self) -> Any:
        """The ops ``runtime.mlm`` pretrains an encoder with (masked language modelling)."""
        raise NotImplementedError(
            f"the {self.name} backend does not pretrain (objective mlm) yet; use the paddle backend"
        )

    def train(self, spec: JobSpec, workdir: Path, emit: Emit) -> dict[str, Any]:
        if spec.objective == "mlm":
            from runtime import mlm

            return mlm.fit(spec, workdir, emit, self.mlm_ops())
        if spec.task_kind in GENERATIVE_KINDS:
            from runtime import llm

            self.llm = self.llm_ops()  # export writes out the model this trained
            return llm.fit(spec, workdir, emit, self.llm)
        from runtime.loop import fit

        return fit(spec, workdir, emit, self.model_ops())

    def export(self, spec: JobSpec, workdir: Path, out_dir: Path) -> dict[str, str]:
        if spec.task_kind in GENERATIVE_KINDS:
            from runtime import llm

            return llm.export(spec, workdir, out_dir, self.llm)
        return self.export_classifier(spec, workdir, out_dir)


def available() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def get_backend(name: str) -> Backend:
    found = available()
    if name not in found:
        raise BackendNotFound(
            f"no training backend named {name!r}; installed: {', '.join(sorted(found)) or 'none'}"
        )
    return found[name].load()()
