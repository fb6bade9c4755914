"""Build a tiny random-weight Llama-architecture model and its tokenizer, locally (nothing is
downloaded): `python tests/vllm/tiny_model.py OUT_DIR` with the vLLM environment's Python.

The tokenizer is a byte-level BPE of 2048 tokens trained on the Python standard library's own
sources, with Llama-3-style special tokens and a chat template. The model has 2 layers, hidden
size 128 and 4 heads: head_dim 32, the smallest vLLM's CPU attention backend supports.
Fixed seeds: the same directory every time.
"""

from __future__ import annotations

import importlib
import sys
import sysconfig
from pathlib import Path

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<|pad|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def build(out: Path) -> None:
    # the vLLM environment's packages (not the product's: imported by name, untyped)
    torch, tk, hf = (importlib.import_module(m) for m in ("torch", "tokenizers", "transformers"))
    models, pre_tokenizers, decoders, processors, trainers = (
        tk.models, tk.pre_tokenizers, tk.decoders, tk.processors, tk.trainers)

    corpus = sorted(str(p) for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:80]
    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(corpus, trainers.BpeTrainer(vocab_size=2048, special_tokens=SPECIALS, show_progress=False,
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    hf_tok = hf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                     pad_token="<|pad|>", model_max_length=2048)
    hf_tok.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(out)
    config = hf.LlamaConfig(vocab_size=len(hf_tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                         bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id,
                         pad_token_id=hf_tok.pad_token_id, tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(0)
    hf.LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    hf.GenerationConfig(bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id).save_pretrained(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUT_DIR")
    build(Path(sys.argv[1]))
    print(f"tiny Llama model and tokenizer in {sys.argv[1]}")
