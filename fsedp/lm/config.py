"""Shape of the MoE language model (one source for the torch trainer and the NumPy model)."""

from dataclasses import asdict, dataclass, fields

from fsedp.errors import InputError

__all__ = ["LMConfig"]


@dataclass(frozen=True)
class LMConfig:
    """Decoder-only MoE transformer: pre-norm (RMSNorm), learned positions, causal multi-head
    attention, a MoE feed-forward in every layer (top-k softmax routing over ``experts``
    SwiGLU experts of ``d_ffn`` neurons, plus ``shared_experts`` always-on SwiGLU experts of
    the same size), tied input/output embeddings.

    Parameters
    ----------
    vocab, d_model, layers, heads, context, experts, top_k, d_ffn, shared_experts
        Sizes; ``d_model`` divisible by ``heads``, ``1 <= top_k <= experts``.
    """

    vocab: int = 2048
    d_model: int = 128
    layers: int = 4
    heads: int = 4
    context: int = 128
    experts: int = 16
    top_k: int = 2
    d_ffn: int = 128
    shared_experts: int = 0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            low = 0 if f.name == "shared_experts" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise InputError("<lm config>", f.name, f"must be an integer >= {low}, not {v!r}")
        if self.d_model % self.heads:
            raise InputError(
                "<lm config>",
                "heads",
                f"d_model = {self.d_model} is not divisible by heads = {self.heads}",
            )
        if self.top_k > self.experts:
            raise InputError(
                "<lm config>", "top_k", f"top_k = {self.top_k} exceeds experts = {self.experts}"
            )

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "<lm config>") -> "LMConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InputError(source, unknown[0], f"unknown field; expected one of {sorted(names)}")
        return cls(**{k: int(v) for k, v in d.items()})
