"""The configs of ``import`` and ``export``: models in and out of the suite as Hugging Face Llama folders
(``model/hf.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nope_lightning.config.core import check_choice, check_range
from nope_lightning.config.data import DataConfig
from nope_lightning.config.parts import TrackingConfig
from nope_lightning.config.stages import ExtensionConfig


@dataclass
class ImportConfig:
    """``nope-lightning run import source=<HF folder> out_dir=<folder> [pos_encoding=nope|rope]``: a Hugging
    Face Llama folder as an export folder that every stage's ``checkpoint=`` takes.

    ``pos_encoding``: ``nope`` drops the rotary embedding (paper 001's released NoPE models are Llama folders
    loaded that way), ``rope`` keeps it; empty takes the folder's own, which only folders this suite exported
    record. ``max_positions``: the longest sequence the imported model accepts (0: 16 x its training length).
    ``data``: the data section later stages read as the model's own; its ``corpus`` is the one whose validation
    split a search selects on and whose test split an evaluation reports (the tokenizer is always the imported
    one).
    """

    source: str = ""
    out_dir: str = ""
    pos_encoding: str = ""
    max_positions: int = 0
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self) -> None:
        if not self.source or not self.out_dir:
            raise ValueError("import needs source=<Hugging Face model folder> and out_dir=<export folder to write>")
        if self.pos_encoding:
            check_choice("pos_encoding", self.pos_encoding, ("nope", "rope"))
        check_range("max_positions", self.max_positions, 0)


@dataclass
class ExportConfig:
    """``nope-lightning run export checkpoint=<ours> format=hf out_dir=<folder>``: one of our models as a Llama
    folder that ``transformers`` loads (``LlamaForCausalLM.from_pretrained``), its tokenizer beside it.

    ``extension``: evaluation-time settings to bake in, as evaluate reads them: a position-free temperature (a
    uniform lambda, a HeadScale table, a scale-search's best lambda) is folded into the query rows; a RoPE
    scaling becomes the folder's ``rope_scaling``. A NoPE model loads as a RoPE model unless the rotary step is
    switched off (``docs/checkpoints.md`` shows how).
    """

    checkpoint: str = ""
    out_dir: str = ""
    format: str = "hf"
    extension: ExtensionConfig = field(default_factory=ExtensionConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        if not self.checkpoint or not self.out_dir:
            raise ValueError("export needs checkpoint=<export folder or runs:/<run_id>/model> and out_dir=<folder>")
        check_choice("format", self.format, ("hf",))
