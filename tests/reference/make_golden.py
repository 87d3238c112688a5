#!/usr/bin/env python3
"""Golden files from the reference implementations' own code, for flowtrain's unit tests.

Each section builds a reference model at a tiny size with seeded random weights, saves the
weights under the official key names, fixed inputs and the reference's outputs. The C++ tests
(tests/unit/test_autoencoder.cpp, …) load the weights strictly and compare. Run by hand when a
reference or a section changes, and commit what it writes to tests/reference/golden/:

  FLOWTRAIN_DEPS=~/.cache/flowtrain                   # where scripts/setup.sh put the PyPI torch
  $FLOWTRAIN_DEPS/torch-2.11.0/bin/pip install einops safetensors transformers sentencepiece protobuf ftfy
  $FLOWTRAIN_DEPS/torch-2.11.0/bin/pip install --no-deps open_clip_torch==3.3.0 torchvision==0.26.0  # keeps torch 2.11
  # the FLUX reference: git clone https://github.com/black-forest-labs/flux (commit 802fb47; the src/ folder is enough)
  $FLOWTRAIN_DEPS/torch-2.11.0/bin/python tests/reference/make_golden.py --flux-src FLUX/src

Sections:
  ae   the FLUX autoencoder (flux/modules/autoencoder.py): ae_tiny.safetensors (weights),
       ae_tiny_io.safetensors (x, moments, z = encode(x), decode(z)), and ae_flux_keys.txt:
       every key and shape of the full-size FLUX.1 autoencoder, built on the meta device.
  t5   transformers' T5EncoderModel (T5 v1.1: gated GELU, relative position bias), tiny:
       t5_tiny.safetensors as save_pretrained writes it, t5_tiny_io.safetensors (ids, mask, the
       last hidden state with the mask and without it, FLUX's way), t5_xxl_keys.txt,
       t5_tiny_config.json (the config.json a release folder holds).
  clip transformers' CLIPTextModel, tiny: clip_tiny.safetensors under the released files' names
       (`text_model.` + the module names: transformers 5 saves without the prefix, the files
       FLUX loads have it), clip_tiny_io.safetensors (ids; hidden states; pooled by the
       config's eos_token_id 2 rule, the highest id, and by a first-eos_token_id rule),
       clip_l_keys.txt, clip_tiny_config.json.
  t5tok  transformers' T5Tokenizer on a SentencePiece model trained here as T5's was (unigram,
       nmt_nfkc, pad 0, eos 1, unk 2, no bos): t5_spiece.model and t5_tokenizer_cases.txt, 2,000
       varied captions (accents, CJK, emoji, punctuation, digits, odd spacing, long ones cut at
       max_length 32) each with its ids as the reference pads and truncates them.
  cliptok  CLIP's tokenizer: clip_tokenizer_cases.txt.gz, 2,000 varied captions (one in four with
       a piece that ftfy or HTML unescaping changes) with the ids of transformers' CLIPTokenizer
       and of open_clip's SimpleTokenizer, both on the vocabulary open_clip ships (the test reads
       it from $FLOWTRAIN_DEPS/clip/, where scripts/setup.sh puts it); clip_tokenizer_small/: a
       2,000-merge vocabulary as Hugging Face's vocab.json + merges.txt with transformers' ids.
"""
import argparse
import os
import sys

import torch
from safetensors.torch import save_file

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def seeded_weights(module: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn N(0, 1) / sqrt(fan-in-ish), so activations stay O(1) through the
    net, and every GroupNorm/LayerNorm affine perturbed off (1, 0) so a swapped weight/bias shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() > 1:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def write_key_manifest(module: torch.nn.Module, path: str) -> None:
    with open(path, "w") as f:
        for name, t in module.state_dict().items():
            f.write(f"{name} {','.join(str(d) for d in t.shape)}\n")


def autoencoder(flux_src: str) -> None:
    sys.path.insert(0, flux_src)
    from flux.modules import autoencoder as ae_module

    # The full-size FLUX.1 autoencoder's keys and shapes (official ae.safetensors layout), with
    # the parameters of flux/util.py's configs (the same for dev, schnell and Krea; util.py itself
    # is not imported: it needs the hub, watermarking and image packages).
    flux_params = ae_module.AutoEncoderParams(resolution=256, in_channels=3, ch=128, out_ch=3, ch_mult=[1, 2, 4, 4],
                                              num_res_blocks=2, z_channels=16, scale_factor=0.3611,
                                              shift_factor=0.1159)
    with torch.device("meta"):
        full = ae_module.AutoEncoder(flux_params)
    write_key_manifest(full, os.path.join(GOLDEN, "ae_flux_keys.txt"))

    # A tiny one: the reference's code with GroupNorm(32) built as GroupNorm(4) (through the
    # module's own `nn` name), since 32 groups need >= 32 channels everywhere and the golden
    # weights would be MBs. Widths 8 and 16 exercise the channel-changing nin_shortcut.
    class FewGroupsNN:
        def __getattr__(self, name):
            return _group_norm_4 if name == "GroupNorm" else getattr(torch.nn, name)

    def _group_norm_4(num_groups, num_channels, eps, affine):
        return torch.nn.GroupNorm(4, num_channels, eps=eps, affine=affine)

    ae_module.nn = FewGroupsNN()
    params = ae_module.AutoEncoderParams(resolution=16, in_channels=3, ch=8, out_ch=3, ch_mult=[1, 2],
                                         num_res_blocks=1, z_channels=4, scale_factor=0.3611,
                                         shift_factor=0.1159)
    torch.manual_seed(0)
    model = ae_module.AutoEncoder(params).eval()
    seeded_weights(model, seed=1)
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(2, 3, 16, 12, generator=gen) * 2 - 1  # not square: rows and columns kept apart
    with torch.no_grad():
        moments = model.encoder(x)
        z = model.encode(x)
        decoded = model.decode(z)
    meta = {"ch": "8", "ch_mult": "1,2", "num_res_blocks": "1", "z_channels": "4", "norm_groups": "4",
            "scale_factor": "0.3611", "shift_factor": "0.1159", "torch": torch.__version__}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(GOLDEN, "ae_tiny.safetensors"), metadata=meta)
    save_file({"x": x, "moments": moments, "z": z, "decoded": decoded},
              os.path.join(GOLDEN, "ae_tiny_io.safetensors"), metadata=meta)
    print(f"ae: {sum(p.numel() for p in model.parameters())} parameters, "
          f"|decoded| max {decoded.abs().max():.3f}, full-size keys {len(full.state_dict())}")


def t5() -> None:
    import tempfile

    from transformers import T5Config, T5EncoderModel

    def config(**sizes):
        # google/t5-v1_1-xxl's config but for the sizes: gated GELU (tanh), 32 buckets up to 128.
        return T5Config(feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                        relative_attention_max_distance=128, layer_norm_epsilon=1e-6, dropout_rate=0.0,
                        tie_word_embeddings=False, **sizes)

    with torch.device("meta"):
        full = T5EncoderModel(config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                                     num_heads=64))
    write_key_manifest(full, os.path.join(GOLDEN, "t5_xxl_keys.txt"))

    torch.manual_seed(0)
    model = T5EncoderModel(config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4)).eval()
    seeded_weights(model, seed=3)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        with open(os.path.join(tmp, "model.safetensors"), "rb") as src:
            data = src.read()
    with open(os.path.join(GOLDEN, "t5_tiny.safetensors"), "wb") as dst:
        dst.write(data)
    model.config.to_json_file(os.path.join(GOLDEN, "t5_tiny_config.json"))  # the release folder's config.json
    # 150 positions: distances past 8 (log buckets) and past 128 (the last bucket); row 1 padded
    # after 100 tokens as FLUX's tokenizer pads (id 0).
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(2, 64, (2, 150), generator=gen)
    mask = torch.ones(2, 150, dtype=torch.bool)
    ids[1, 100:] = 0
    mask[1, 100:] = False
    with torch.no_grad():
        masked = model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        unmasked = model(input_ids=ids).last_hidden_state
    save_file({"ids": ids, "mask": mask, "hidden_masked": masked.contiguous(), "hidden": unmasked.contiguous()},
              os.path.join(GOLDEN, "t5_tiny_io.safetensors"),
              metadata={"vocab_size": "64", "d_model": "32", "d_kv": "8", "d_ff": "48", "num_layers": "2",
                        "num_heads": "4", "torch": torch.__version__, "transformers": __import__("transformers").__version__})
    print(f"t5: {sum(p.numel() for p in model.parameters())} parameters, full-size keys {len(full.state_dict())}")


def clip() -> None:
    from transformers import CLIPTextConfig, CLIPTextModel

    def config(**sizes):
        # openai/clip-vit-large-patch14's text config but for the sizes: quick_gelu, eps 1e-5,
        # eos_token_id 2 (the pre-fix value its config.json still has: pool at the highest id).
        return CLIPTextConfig(hidden_act="quick_gelu", layer_norm_eps=1e-5, attention_dropout=0.0,
                              eos_token_id=2, **sizes)

    with torch.device("meta"):
        full = CLIPTextModel(config(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                    num_attention_heads=12, max_position_embeddings=77))
    with open(os.path.join(GOLDEN, "clip_l_keys.txt"), "w") as f:
        for name, t in full.state_dict().items():
            f.write(f"text_model.{name} {','.join(str(d) for d in t.shape)}\n")

    torch.manual_seed(0)
    model = CLIPTextModel(config(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=16)).eval()
    seeded_weights(model, seed=5)
    weights = {"text_model." + k: v.contiguous() for k, v in model.state_dict().items()}
    model.config.to_json_file(os.path.join(GOLDEN, "clip_tiny_config.json"))  # the release folder's config.json
    # Row 0 as CLIP's tokenizer writes a caption: start 98, words, end 99, padded with the end token.
    # Row 1: end token 50 at position 5 and a higher id 99 at 10, where the two pooling rules part.
    ids = torch.tensor([[98, 10, 11, 12, 13, 14, 15, 99] + [99] * 8,
                        [98, 20, 21, 22, 23, 50, 24, 25, 26, 27, 99, 28, 29, 30, 31, 32]])
    with torch.no_grad():
        out = model(input_ids=ids)
        model.eos_token_id = 50  # the reference's first-eos_token_id rule
        pooled_eos = model(input_ids=ids).pooler_output
    meta = {"vocab_size": "100", "hidden": "32", "intermediate": "48", "layers": "2", "heads": "4",
            "max_positions": "16", "torch": torch.__version__}
    save_file(weights, os.path.join(GOLDEN, "clip_tiny.safetensors"), metadata=meta)
    save_file({"ids": ids, "hidden": out.last_hidden_state.contiguous(), "pooled": out.pooler_output.contiguous(),
               "pooled_eos50": pooled_eos.contiguous()}, os.path.join(GOLDEN, "clip_tiny_io.safetensors"), metadata=meta)
    print(f"clip: {sum(p.numel() for p in model.parameters())} parameters, full-size keys {len(full.state_dict())}")


def varied_captions(n: int, seed: int, more: tuple = (), lengths: tuple = (1, 3, 6, 10, 20, 45)) -> list[str]:
    """Captions of the kinds a data set holds, drawn from a seeded generator (`more`: extra pieces)."""
    import random
    rng = random.Random(seed)
    words = ("a photo of the red dress on a wooden chair beside blue sneakers at night street market garden "
             "portrait close-up watercolor painting sketch 4k highly detailed cinematic lighting woman man dog "
             "cat city skyline ocean sunset mountain forest snow rain").split()
    extra = ["café", "naïve", "Zürich", "résumé", "São Paulo", "東京の夜", "北京", "😀", "🐶🐱", "ﬁne", "Ｆｕｌｌ",
             "½ cup", "x²", "—", "“quoted”", "it's", "can't", "e.g.", "U.S.A.", "#hashtag", "@user", "100%",
             "3.14", "1,024", "2024-05-01", "C++", "<tag>", "a/b", "&amp;", "tab\there", "two  spaces", " lead",
             "trail ", "ALL CAPS", "MiXeD", "Ελληνικά", "русский", "עברית", "العربية", "हिन्दी", "ß", "ﬀ"] + list(more)
    out = []
    for i in range(n):
        k = rng.choice(lengths)  # the long ones exceed the tokenizer's max_length
        parts = [rng.choice(words) if rng.random() < 0.75 else rng.choice(extra) for _ in range(k)]
        text = " ".join(parts)
        if rng.random() < 0.3:
            text = text.capitalize() + rng.choice([".", "!", "?", ",", "...", ""])
        out.append(text)
    return out


def t5_tokenizer() -> None:
    import io
    import shutil
    import tempfile

    import sentencepiece as spm
    from transformers import T5Tokenizer

    corpus = varied_captions(3000, seed=6)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model, model_type="unigram",
                                   vocab_size=400, hard_vocab_limit=False, normalization_rule_name="nmt_nfkc", pad_id=0, eos_id=1,
                                   unk_id=2, bos_id=-1, character_coverage=1.0, num_threads=1,
                                   byte_fallback=False, minloglevel=2)
    path = os.path.join(GOLDEN, "t5_spiece.model")
    with open(path, "wb") as f:
        f.write(model.getvalue())
    # As a checkpoint's folder holds it (spiece.model): T5Tokenizer(vocab_file=…) in transformers 5
    # does not convert the SentencePiece model, from_pretrained does.
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(path, os.path.join(folder, "spiece.model"))
        tokenizer = T5Tokenizer.from_pretrained(folder, extra_ids=100, legacy=True)
    captions = varied_captions(2000, seed=7)
    max_length = 32
    lines = [f"# transformers {__import__('transformers').__version__} T5Tokenizer.from_pretrained(spiece.model, "
             f"extra_ids=100, legacy=True)(caption, max_length={max_length}, truncation=True, padding='max_length'): "
             "the caption's line, then its ids (padding 0 dropped)"]
    for caption in captions:
        ids = tokenizer(caption, max_length=max_length, truncation=True, padding="max_length")["input_ids"]
        assert "\n" not in caption
        lines.append(caption)
        lines.append(" ".join(str(i) for i in ids if i != 0))
    with open(os.path.join(GOLDEN, "t5_tokenizer_cases.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    cut = sum(1 for line in lines[2::2] if len(line.split()) == max_length)
    print(f"t5tok: {len(tokenizer)} ids, {len(captions)} captions, {cut} cut at {max_length}")


# Text that the references' clean-up changes: HTML entities (open_clip unescapes them twice),
# mojibake, curly quotes, ligatures, full-width forms, C1 controls (ftfy.fix_text), combining
# accents (NFC), and Unicode whitespace.
CLEANUP_PIECES = ("&quot;x&quot;", "&#39;s", "Tom &amp; Jerry", "&lt;b&gt;", "&amp;amp;", "&eacute;t&eacute;", "&#x2014;",
                  "cafÃ©", "naÃ¯ve", "â€œmojibakeâ€\x9d", "‘single’", "„low“", "ﬁeld", "ﬂower", "ＡＢＣ", "１２３",
                  "e\u0301clair", "A\u030a", "no\u00a0break", "thin\u2009space", "ideo\u3000graphic",
                  "İstanbul", "ΣΟΦΟΣ", "Straße", "ǅ", "x\u0085y", "ﬆ", "½", "⅔", "Ⅻ", "²³", "٣", "〇")


def write_hugging_face_clip_files(folder: str, vocab: list, merges: list) -> None:
    import json
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")


def clip_tokenizer() -> None:
    import gzip
    import hashlib
    import tempfile

    import ftfy
    import open_clip
    from open_clip.tokenizer import SimpleTokenizer, bytes_to_unicode, default_bpe
    from transformers import CLIPTokenizer

    bpe_path = default_bpe()
    with open(bpe_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    reference = SimpleTokenizer(bpe_path)
    # The released Hugging Face files (vocab.json + merges.txt) hold the same vocabulary as
    # open_clip's file: FLUX's CLIPTokenizer reads those.
    merges = gzip.open(bpe_path).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m.split()) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    with tempfile.TemporaryDirectory() as folder:
        write_hugging_face_clip_files(folder, vocab, merges)
        hf = CLIPTokenizer.from_pretrained(folder)
    assert hf.bos_token_id == 49406 and hf.eos_token_id == 49407 == hf.pad_token_id

    import random
    rng = random.Random(9)
    captions = varied_captions(2000, seed=8, lengths=(1, 3, 6, 10, 20, 45, 70))
    for i in range(0, len(captions), 4):  # one caption in four gets a piece the clean-ups change
        words = captions[i].split(" ")
        words.insert(rng.randrange(len(words) + 1), rng.choice(CLEANUP_PIECES))
        captions[i] = " ".join(words)
    max_length = 77
    lines = [f"# open_clip {open_clip.__version__} SimpleTokenizer (ftfy {ftfy.__version__}) on bpe_simple_vocab_16e6.txt.gz "
             f"sha256 {digest}, and transformers {__import__('transformers').__version__} CLIPTokenizer on the same "
             f"vocabulary, at max_length {max_length}: per caption three lines: the caption (unicode_escape'd), "
             "the ids transformers gives (padding dropped), the ids open_clip gives (padding dropped; = when the same)"]
    differ = 0
    for caption in captions:
        assert "\n" not in caption and "\r" not in caption
        ids_hf = hf(caption, max_length=max_length, truncation=True, padding="max_length")["input_ids"]
        ids_hf = ids_hf[:ids_hf.index(49407) + 1]
        ids_oc = reference([caption], context_length=max_length)[0].tolist()
        ids_oc = ids_oc[:ids_oc.index(49407) + 1]
        differ += ids_hf != ids_oc
        lines += [caption.encode("unicode_escape").decode("ascii"), " ".join(map(str, ids_hf)),
                  "=" if ids_oc == ids_hf else " ".join(map(str, ids_oc))]
    with gzip.open(os.path.join(GOLDEN, "clip_tokenizer_cases.txt.gz"), "wt", encoding="ascii", compresslevel=9) as f:
        f.write("\n".join(lines) + "\n")
    cut = sum(1 for line in lines[2::3] if len(line.split()) == max_length)

    # The Hugging Face files as they are read: a small vocabulary (the first 2,000 merges) in
    # vocab.json + merges.txt, and transformers' ids with it.
    small = os.path.join(GOLDEN, "clip_tokenizer_small")
    os.makedirs(small, exist_ok=True)
    small_vocab = vocab[:512] + vocab[512:512 + 2000] + ["<|startoftext|>", "<|endoftext|>"]
    write_hugging_face_clip_files(small, small_vocab, merges[:2000])
    small_hf = CLIPTokenizer.from_pretrained(small)
    small_lines = [f"# transformers {__import__('transformers').__version__} CLIPTokenizer.from_pretrained(this folder) "
                   f"at max_length {max_length}: the caption (unicode_escape'd), then its ids (padding dropped)"]
    for caption in captions[:150]:
        ids = small_hf(caption, max_length=max_length, truncation=True, padding="max_length")["input_ids"]
        end = small_hf.eos_token_id
        small_lines += [caption.encode("unicode_escape").decode("ascii"), " ".join(map(str, ids[:ids.index(end) + 1]))]
    with open(os.path.join(small, "cases.txt"), "w", encoding="ascii") as f:
        f.write("\n".join(small_lines) + "\n")
    print(f"cliptok: {len(captions)} captions, {cut} cut at {max_length}, {differ} where the two references differ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flux-src", help="the src/ folder of black-forest-labs/flux (section ae)")
    parser.add_argument("sections", nargs="*", help="which to write (default: all): ae t5 clip t5tok cliptok")
    args = parser.parse_args()
    args.sections = args.sections or ["ae", "t5", "clip", "t5tok", "cliptok"]
    for section in args.sections:
        if section not in ("ae", "t5", "clip", "t5tok", "cliptok"):
            parser.error(f"unknown section '{section}'")
    if "ae" in args.sections and not args.flux_src:
        parser.error("section ae needs --flux-src")
    os.makedirs(GOLDEN, exist_ok=True)
    torch.set_num_threads(1)
    if "ae" in args.sections:
        autoencoder(args.flux_src)
    if "t5" in args.sections:
        t5()
    if "clip" in args.sections:
        clip()
    if "t5tok" in args.sections:
        t5_tokenizer()
    if "cliptok" in args.sections:
        clip_tokenizer()


if __name__ == "__main__":
    main()
