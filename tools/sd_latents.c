/* sd-latents: cache VAE latents of a bucketed JSONL stream into one shard.
 * This file is the command line only; the work is in tools/latents/. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "err.h"
#include "latents/latents.h"
#include "log.h"
#include "pool.h"

/* "i/N" with 0 <= i < N; 0 on success. */
static int parse_part(const char *s, int *index, int *count)
{
    char *end;
    long i = strtol(s, &end, 10);
    if (end == s || *end != '/') return -1;
    const char *p = end + 1;
    long n = strtol(p, &end, 10);
    if (end == p || *end || n < 1 || n > 1 << 20 || i < 0 || i >= n) return -1;
    *index = (int)i;
    *count = (int)n;
    return 0;
}

/* Format a usage problem into msg; returns 1 so checks read as
 * `if (cond) bad = usage_msg(...)`; the last problem found is reported. */
static int usage_msg(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int usage_msg(char *msg, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    return 1;
}

/* Options and their checks (every usage problem before any work), then latents_run, or
 * latents_attach for --text-only. */
int main(int argc, char **argv)
{
    latents_opts o = {.device = "cpu", .dtype_name = "fp16", .shard_count = 1};
    const char *part = NULL, *mixed = "no", *vae_act = "fp32", *masks = NULL;
    long batch = 1, text_batch = 32, threads = 0, groups = 0, seed = 0, clip_skip = 0, max_ws_mib = 0, max_tokens = 75;
    int quiet = 0, verbose = 0, text_only = 0;
    double gpu_mem_gib = 0;
    const sd_opt opts[] = {
        {"output", 'o', SD_OPT_STR, &o.output, "SHARD", "the shard to write (created if missing, else resumed)"},
        {"vae", 0, SD_OPT_STR, &o.vae_path, "PATH",
         "diffusers model folder, its vae/ folder, or a .safetensors file (single-file checkpoint or VAE)"},
        {"vae-config", 0, SD_OPT_STR, &o.vae_config, "FILE", "a diffusers config.json for a single-file VAE"},
        {"vae-groups", 0, SD_OPT_INT, &groups, "N", "norm groups when no config.json says (default 32)"},
        {"scale", 0, SD_OPT_DOUBLE, &o.scale, "X",
         "scaling factor recorded in the shard's meta, a finite number > 0 (default, or 0: config.json, 0.13025 for "
         "SDXL checkpoints, else 0.18215, a guess that is warned about); the latents are stored unscaled, so a "
         "rerun with another --scale only rewrites the meta, and one without --scale whose factor differs from "
         "the shard's is refused"},
        {"text", 0, SD_OPT_STR, &o.text_model, "MODEL",
         "also cache CLIP text embeddings, once per distinct caption: a diffusers model folder (text_encoder/, "
         "tokenizer/; SDXL: also *_2/) or a single-file checkpoint with --tokenizer"},
        {"tokenizer", 0, SD_OPT_STR, &o.tokenizer, "DIR", "folder holding tokenizer/ (and tokenizer_2/) for --text"},
        {"text-only", 0, SD_OPT_FLAG, &text_only, NULL,
         "no VAE: attach --text embeddings to the latent records SHARD already holds, by record name, from the "
         "input's captions (only key and caption are read: sd-meta's output will do). For caches made without "
         "them: sd-pack import-kohya of an SD 1.x/2.x cache, sd-latents without --text. A record's latents and "
         "key stay; a record that refers to another caption's embedding is pointed at this one"},
        {"text-weights", 0, SD_OPT_STR, &o.text_weights, "T",
         "--text on the CPU: hold the encoders' layer matrices as fp32 (default), fp16 or bf16 (half the memory; "
         "fp32 arithmetic; fp16 files into fp16 give the fp32 embeddings bit for bit)"},
        {"clip-skip", 0, SD_OPT_INT, &clip_skip, "N",
         "skip N more text-encoder layers than the SD variant's default (kohya's --clip_skip 2 is 1 here)"},
        {"max-tokens", 0, SD_OPT_INT, &max_tokens, "N",
         "--text: caption tokens kept, 75 (default: 77 ids with BOS and EOS), 150 or 225 as sd-scripts' "
         "--max_token_length: 75-token chunks each wrapped in BOS/EOS and padded as that encoder's tokenizer pads, "
         "encoded alone, their hidden states joined into 152 or 227 rows (SDXL's pooled output: the first "
         "chunk's). Embeddings of each length get their own keys; sd-train takes one length per run"},
        {"device", 0, SD_OPT_STR, &o.device, "DEV", "cpu (default) or cuda:K: the VAE and the --text encoders on GPU K (decoding stays on the CPU)"},
        {"tf32", 0, SD_OPT_FLAG, &o.tf32, NULL,
         "GPU: TF32 tensor cores (2.7x faster VAE on an H100, ~1e-3 relative error; records made so get their own "
         "keys, so a later run without --tf32 replaces them)"},
        {"mixed-precision", 0, SD_OPT_STR, &mixed, "T",
         "GPU: no (default), bf16 or fp16: every convolution, linear layer and attention product takes 16-bit "
         "copies of its inputs (tensor cores, fp32 accumulation, as torch.autocast); the stored latents stay "
         "as --dtype says. Records made so get their own keys. fp16 turns an input above 65504 into infinity "
         "(the original SDXL VAE is known for such activations: bf16, or its fp16-fix variant, avoids them)"},
        {"vae-activations", 0, SD_OPT_STR, &vae_act, "T",
         "CPU: store the VAE encoder's activations as fp32 (default), fp16 or bf16: half the encoder's scratch "
         "memory (216 MB instead of 408 MB at 512x512), fp32 arithmetic, each layer's output rounded to 16 bits "
         "(the latent mean moves by ~1.5e-3 of its largest value with fp16, ~1.2e-2 with bf16), about as fast. "
         "fp16 turns an activation above 65504 into infinity (the original SDXL VAE is known for such "
         "activations: bf16, or its fp16-fix variant, avoids them). Records made so get their own keys"},
        {"gpu-memory-limit", 0, SD_OPT_DOUBLE, &gpu_mem_gib, "GIB",
         "GPU: hold at most this much device memory in sdtk's allocator (the CUDA libraries' own few hundred MiB "
         "come on top), as on a smaller card (default: what the device has)"},
        {"max-workspace", 0, SD_OPT_INT, &max_ws_mib, "MIB",
         "skip (named, counted) the records of a bucket whose VAE workspace, one image's, is over MIB MiB or "
         "cannot be allocated, before decoding them; the other buckets go on (default: on the CPU the memory the "
         "process may use, the machine's or its cgroup's limit; on a GPU whatever it can allocate)"},
        {"cudnn-search", 0, SD_OPT_FLAG, &o.cudnn_search, NULL,
         "GPU: time cuDNN's convolution algorithms per shape and take the fastest (1.5x at --batch 8 in strict "
         "fp32 on an H100); the choice depends on timing, so a resumed run's latents may differ in the last bits"},
        {"root", 0, SD_OPT_STR, &o.root, "DIR",
         "resolve relative image paths against DIR, as sd-bucket --root did (default: the current directory)"},
        {"shard", 0, SD_OPT_STR, &part, "I/N", "cache only records whose key hashes to part I of N (one process per GPU)"},
        {"batch", 'b', SD_OPT_INT, &batch, "N", "images per VAE batch, all of one bucket (default 1)"},
        {"text-batch", 0, SD_OPT_INT, &text_batch, "N",
         "--text: captions per text transaction, their new ones encoded together before any image (default 32)"},
        {"threads", 'j', SD_OPT_INT, &threads, "N", "CPU threads for decoding and the CPU engine (default: all CPUs)"},
        {"flip", 0, SD_OPT_FLAG, &o.flip, NULL, "also store the left-right flipped image's latents"},
        {"masks", 0, SD_OPT_STR, &masks, "SRC",
         "also store each record's loss mask (sd-train --masked-loss): alpha, the image's alpha channel (kohya's "
         "alpha_mask; an image without one gets none, which trains as all ones), or files, NAME_mask.png beside "
         "the image NAME.ext (its first band: grey or red; not for tar members; an image without one gets none). "
         "The mask goes through the record's resize and crop as the picture does, is taken as value / 255 and "
         "stored at the latent size, the mean of each 8x8 block, as sd-scripts' masked loss reduces it. A mask "
         "file of another size than its image or one that cannot be read skips the record; a NAME_mask.png whose "
         "image is not in the input is reported (mask without an image); all counted, the run goes on"},
        {"sample", 0, SD_OPT_FLAG, &o.sample, NULL,
         "store one sample (mean + std * noise, like kohya) instead of mean and std"},
        {"seed", 0, SD_OPT_INT, &seed, "N",
         "noise seed for --sample (per record: hash of the key and N); without --sample it changes nothing"},
        {"dtype", 0, SD_OPT_STR, &o.dtype_name, "T", "stored type: fp16 (default), bf16 or fp32"},
        {"nosync", 0, SD_OPT_FLAG, &o.nosync, NULL,
         "no fsync per batch, only at the end (a killed process loses nothing; an OS crash or power loss before the end may leave the shard corrupt, LMDB's MDB_NOSYNC: rebuild it then)"},
        {"strict", 0, SD_OPT_FLAG, &o.strict, NULL, "exit 1 when any record was skipped"},
        {"quiet", 'q', SD_OPT_FLAG, &quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &verbose, NULL, "debug messages"},
        {NULL, 0, 0, NULL, NULL, NULL}};
    sd_cli cli = {"sd-latents", "[OPTIONS] --vae PATH -o SHARD [INPUT.jsonl|-]\n       sd-latents --text MODEL --text-only -o SHARD [INPUT.jsonl|-]",
                  "Decode, resize and crop every record of a bucketed JSONL stream (sd-meta | sd-bucket) as its "
                  "`resize` and `crop` say, encode it with the VAE and store the posterior's mean and std (or one "
                  "sample) in an LMDB shard, one transaction per batch (on a GPU a batch encodes while the next "
                  "decodes). Rerunning resumes: records already stored "
                  "with the same plan, options and VAE (its weights and encoder config) are skipped; records whose "
                  "plan changed are replaced; a run whose --dtype, --flip, --sample, --seed (with --sample) or "
                  "--vae-activations differ from the shard's is refused (exit 2, nothing written: use a new -o); with --text, a record whose caption changed keeps its latents "
                  "and gets the new caption's embedding (no image encoded again). A shard made before the VAE's "
                  "config joined its "
                  "model_hash is encoded again whole. Unreadable images, tar members that are no longer at "
                  "their recorded offset, records whose plan is missing or wrong (the reason named) and buckets whose VAE workspace cannot be had (--max-workspace) "
                  "are reported and counted; the run goes on.",
                  opts,
                  "Examples:\n"
                  "  sd-meta data/ | sd-bucket --plan sdxl | sd-latents --vae sdxl-model/ -o cache/latents.shard\n"
                  "  sd-latents --vae vae.safetensors --shard 0/4 -o cache/part0.shard bucketed.jsonl   # 4 processes\n"
                  "  sd-latents --vae sd15/ --masks alpha -o masked.shard bucketed.jsonl   # then sd-train --masked-loss\n"
                  "  sd-meta --source kohya meta_cap_dd.json --no-check-images | sd-latents --text sd15/ --text-only "
                  "-o kohya.lmdb\n"
                  "  sd-latents --vae sd15/ --text sd15/ --max-tokens 225 -o tags.lmdb bucketed.jsonl   # long tag lists\n",
        NULL};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) return rc;
    sd_log_setup("sd-latents", quiet ? SD_LOG_WARN : verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    char msg[256];
    int bad = 0;
    if (pos.n > 1) bad = usage_msg(msg, sizeof msg, "one input stream at most (got %d)", pos.n);
    o.input = pos.n ? pos.v[0] : "-";
    if (!o.output) bad = usage_msg(msg, sizeof msg, "no output shard (-o SHARD)");
    if (!o.vae_path && !text_only) bad = usage_msg(msg, sizeof msg, "no VAE (--vae PATH)");
    if (text_only && !o.text_model) bad = usage_msg(msg, sizeof msg, "--text-only needs --text MODEL");
    if (text_only && (o.vae_path || o.vae_config || groups || o.scale || o.flip || o.sample || seed || part ||
                      batch != 1 || o.cudnn_search || max_ws_mib || strcmp(vae_act, "fp32")))
        bad = usage_msg(msg, sizeof msg,
                        "--text-only runs no VAE: --vae, --vae-config, --vae-groups, --vae-activations, --scale, "
                        "--flip, --sample, --seed, --shard, --batch, --max-workspace and --cudnn-search do not apply");
    if (masks && strcmp(masks, "alpha") == 0) o.masks = LATENTS_MASK_ALPHA;
    else if (masks && strcmp(masks, "files") == 0) o.masks = LATENTS_MASK_FILES;
    else if (masks) bad = usage_msg(msg, sizeof msg, "--masks must be alpha or files, not '%.40s'", masks);
    if (text_only && masks) bad = usage_msg(msg, sizeof msg, "--text-only runs no VAE: --masks does not apply");
    if (part && parse_part(part, &o.shard_index, &o.shard_count))
        bad = usage_msg(msg, sizeof msg, "--shard %s: expected I/N with 0 <= I < N", part);
    if (batch < 1 || batch > 1024) bad = usage_msg(msg, sizeof msg, "--batch must be 1..1024");
    if (text_batch < 1 || text_batch > 1024) bad = usage_msg(msg, sizeof msg, "--text-batch must be 1..1024");
    if (threads < 0 || threads > 1024) bad = usage_msg(msg, sizeof msg, "--threads must be 0..1024");
    if (groups < 0 || groups > 4096) bad = usage_msg(msg, sizeof msg, "--vae-groups must be 0..4096");
    if (seed < 0) bad = usage_msg(msg, sizeof msg, "--seed must not be negative");
    if (max_ws_mib < 0 || max_ws_mib > 1L << 30)
        bad = usage_msg(msg, sizeof msg, "--max-workspace must be 0..%ld MiB (0: the default)", 1L << 30);
    if (clip_skip < 0 || clip_skip > 48) bad = usage_msg(msg, sizeof msg, "--clip-skip must be 0..48");
    if (max_tokens != 75 && max_tokens != 150 && max_tokens != 225)
        bad = usage_msg(msg, sizeof msg, "--max-tokens %ld: expected 75, 150 or 225", max_tokens);
    else if (max_tokens != 75 && !o.text_model) bad = usage_msg(msg, sizeof msg, "--max-tokens needs --text");
    if (o.tokenizer && !o.text_model) bad = usage_msg(msg, sizeof msg, "--tokenizer needs --text");
    if (o.text_weights && !o.text_model) bad = usage_msg(msg, sizeof msg, "--text-weights needs --text");
    if (!isfinite(o.scale) || o.scale < 0)
        bad = usage_msg(msg, sizeof msg, "--scale must be a finite number > 0 (0: the default)");
    if (!latents_dtype(o.dtype_name))
        bad = usage_msg(msg, sizeof msg, "--dtype %s: expected fp16, bf16 or fp32", o.dtype_name);
    if (o.text_weights && !latents_dtype(o.text_weights))
        bad = usage_msg(msg, sizeof msg, "--text-weights %s: expected fp32, fp16 or bf16", o.text_weights);
    if (sd_cli_parse_device(o.device, &o.cuda_device))
        bad = usage_msg(msg, sizeof msg, "--device %s: expected cpu or cuda:K", o.device);
    else if (sd_cli_parse_mixed(mixed, &o.mixed))
        bad = usage_msg(msg, sizeof msg, "--mixed-precision %s: expected no, bf16 or fp16", mixed);
    else if (!latents_dtype(vae_act))
        bad = usage_msg(msg, sizeof msg, "--vae-activations %s: expected fp32, fp16 or bf16", vae_act);
    else if (strcmp(vae_act, "fp32") && o.cuda_device >= 0)
        bad = usage_msg(msg, sizeof msg, "--vae-activations %s runs on the CPU only (no 16-bit activation ops on "
                        "the GPU yet; --mixed-precision is the GPU's 16-bit mode)", vae_act);
    else if (sd_cli_gib_bytes(gpu_mem_gib, &o.gpu_mem_limit))
        bad = usage_msg(msg, sizeof msg, "--gpu-memory-limit: GiB, 0 or more");
    else if ((o.tf32 || o.cudnn_search || o.mixed || o.gpu_mem_limit) && o.cuda_device < 0)
        bad = usage_msg(msg, sizeof msg,
                        "--tf32, --mixed-precision, --cudnn-search and --gpu-memory-limit are GPU options: add "
                        "--device cuda:K");
    else if (o.text_weights && strcmp(o.text_weights, "fp32") && o.cuda_device >= 0)
        bad = usage_msg(msg, sizeof msg, "--text-weights %s is for the CPU encoder; on a GPU the weights stay fp32",
                        o.text_weights);
    if (bad) {
        sd_cli_usage_error(&cli, "%s", msg);
        sd_strlist_free(&pos);
        return SD_EXIT_USAGE;
    }
    o.batch = (int)batch;
    o.text_batch = (int)text_batch;
    o.threads = threads > 0 ? (int)threads : sd_default_threads();
    o.vae_groups = (int)groups;
    o.vae_act = strcmp(vae_act, "fp32") ? latents_dtype(vae_act) : 0;
    o.clip_skip = (int)clip_skip;
    o.max_tokens = (int)max_tokens;
    o.max_workspace = (size_t)max_ws_mib << 20;
    o.seed = (uint64_t)seed;
    o.quiet = quiet;
    o.verbose = verbose;
    if (seed && !o.sample)
        sd_log(SD_LOG_WARN, "--seed %ld without --sample changes nothing: the seed draws only --sample's noise", seed);
    rc = text_only ? latents_attach(&o) : latents_run(&o);
    sd_strlist_free(&pos);
    return rc;
}
