"""Types of kvscope's runtime module (app/python/runtime_module.cpp): kvscope.Model, kvscope.eval_suite."""

from typing import Any, Dict, List, Optional, Sequence, Union

from ._kvscope import KV, PathLike, Profile

class Model:
    """A model in kvscope's runtime (libtorch, CPU). path None = the embedded default, as kvscope-cli
    resolves --model; the keywords are the CLI's model group (--threads, --compute, --kv-dtype,
    --weights, --block, --attn-mass)."""

    def __init__(
        self,
        path: Optional[PathLike] = None,
        *,
        tokenizer: Optional[PathLike] = None,
        threads: int = 0,
        compute: str = "fp32",
        kv_dtype: str = "fp16",
        weights: str = "auto",
        block: int = 512,
        attn_mass: bool = False,
    ) -> None: ...
    @property
    def info(self) -> Dict[str, Any]:
        """The object `kvscope-cli info --json` prints."""
    @property
    def path(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def architecture(self) -> str: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def chat(self) -> bool:
        """True for ChatML models."""
    def tokenize(self, text: str, *, special: bool = True) -> List[int]:
        """As `kvscope-cli tokenize` (special=False: --no-special)."""
    def detokenize(self, ids: Sequence[int], *, skip_special: bool = True) -> str: ...
    def capture(self, text: str) -> KV:
        """The cache `kvscope-cli capture` writes for this text: values, tokens, RoPE, attention statistics."""
    def generate(
        self,
        prompt: str,
        kv: Optional[KV] = None,
        *,
        max_new_tokens: int = 64,
        chat: bool = False,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop: bool = True,
    ) -> str:
        """The text `kvscope-cli generate` prints (greedy at temperature 0). With kv the prompt is asked
        after that cache as the question (`kvscope-cli generate KV.h5`), and chat is not consulted."""
    def generate_json(
        self,
        prompt: str,
        kv: Optional[KV] = None,
        *,
        max_new_tokens: int = 64,
        chat: bool = False,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop: bool = True,
    ) -> Dict[str, Any]:
        """The object `kvscope-cli generate --json` prints: prompt_tokens, cached_tokens, tokens, text, ..."""

def model_fingerprint(path: Optional[PathLike] = None) -> str:
    """The fingerprint kvscope records for a model (`kvscope-cli info`'s); None = the default model."""
def eval_suite(
    suite: PathLike,
    *,
    model: Optional[PathLike] = None,
    tokenizer: Optional[PathLike] = None,
    codec: str = "cachegen",
    profile: Union[None, PathLike, Profile] = None,
    levels: Union[str, int, Sequence[int]] = "all",
    baselines: Union[str, Sequence[str]] = "fp16,int8,kivi2,kivi4",
    split: str = "all",
    items: Union[None, str, Sequence[str]] = None,
    threads: int = 1,
    answer_tokens: int = 32,
    max_continuation: int = 256,
    suite_cache: Optional[PathLike] = None,
    use_suite_cache: bool = True,
    attn_mass: bool = False,
    compute: str = "fp32",
    kv_dtype: str = "fp16",
    weights: str = "auto",
) -> Dict[str, Any]:
    """The object `kvscope-cli eval --suite SUITE --json` prints (the same C++ function)."""
