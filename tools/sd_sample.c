/* sd-sample: render prompts with a Stable Diffusion model into PNG files.
 * This file is the command line only; the work is in tools/sample/. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "log.h"
#include "pool.h"
#include "sample/sample.h"

/* Options, their checks (every usage problem before any work), then the run. */
int main(int argc, char **argv)
{
    sample_opts o = {.device = "cpu", .contact = 1};
    const char *sampler = "dpmpp_2m";
    long seed = 0, steps = 20, width = 0, height = 0, threads = 0, max_tokens = 75;
    double cfg = 7.0;
    int quiet = 0, verbose = 0, no_contact = 0;
    const sd_opt opts[] = {
        {"model", 0, SD_OPT_STR, &o.src.path, "PATH",
         "a diffusers model folder: unet/, vae/, text_encoder/, tokenizer/ (SDXL: also text_encoder_2/, "
         "tokenizer_2/), scheduler/scheduler_config.json for prediction_type (none: epsilon); or a single-file "
         "checkpoint (.safetensors, ldm/sgm names as A1111 and ComfyUI load) with --tokenizer"},
        {"tokenizer", 0, SD_OPT_STR, &o.src.tokenizer, "DIR",
         "a folder holding tokenizer/ (SDXL: and tokenizer_2/): needed with a single-file --model"},
        {"prediction", 0, SD_OPT_STR, &o.src.prediction, "TYPE",
         "epsilon or v_prediction (default: the folder's scheduler config; a single file: epsilon)"},
        {"unet-config", 0, SD_OPT_STR, &o.src.unet_config, "FILE", "a diffusers config.json for the UNet (default: "
         "the folder's, or inferred from a single file's shapes)"},
        {"vae-config", 0, SD_OPT_STR, &o.src.vae_config, "FILE", "the same for the VAE"},
        {"text-config", 0, SD_OPT_STR, &o.src.text_config[0], "FILE", "the same for the (first) text encoder"},
        {"text-config-2", 0, SD_OPT_STR, &o.src.text_config[1], "FILE", "the same for SDXL's second text encoder"},
        {"max-tokens", 0, SD_OPT_INT, &max_tokens, "N",
         "caption tokens the prompts are encoded with: 75 (default: one 77-token CLIP sequence), 150 or 225: "
         "cut into 75-token chunks, each encoded alone and the hidden states joined, as sd-latents --max-tokens "
         "caches training captions (sd-scripts' --max_token_length; not A1111's prompt weighting); use the "
         "length the UNet was trained with"},
        {"prompts", 0, SD_OPT_STR, &o.prompts, "FILE.jsonl",
         "one JSON object per line with any of prompt, negative, seed, steps, cfg, sampler, width, height; a "
         "field left out takes the value of the option of its name below; a line with another key (a typo such as "
         "\"promt\") is skipped, named and counted"},
        {"output", 'o', SD_OPT_STR, &o.output, "DIR", "where the images go (created if missing)"},
        {"prompt", 0, SD_OPT_STR, &o.defaults.prompt, "TEXT", "the prompt without --prompts (default \"\")"},
        {"negative", 0, SD_OPT_STR, &o.defaults.negative, "TEXT",
         "the negative prompt (default \"\"; SDXL then conditions on zeros, as diffusers does)"},
        {"seed", 0, SD_OPT_INT, &seed, "N",
         "the noise seed, 0..2^53-1 (default 0): torch.randn with a CPU generator seeded so, as diffusers and "
         "ComfyUI draw it"},
        {"steps", 0, SD_OPT_INT, &steps, "N", "sampling steps, 1..1000 (default 20)"},
        {"cfg", 0, SD_OPT_DOUBLE, &cfg, "X", "classifier-free guidance scale, 0..100 (default 7; 1 or less: none)"},
        {"sampler", 0, SD_OPT_STR, &sampler, "NAME",
         "ddim, euler, euler_a, dpmpp_2m (default) or dpmpp_2m_karras, each with the model's timestep spacing as "
         "diffusers gives it"},
        {"width", 0, SD_OPT_INT, &width, "PX",
         "image width, a multiple of 8 (default: the UNet's sample_size times the VAE's factor: 512 for SD 1.5, 768 "
         "for SD 2.x-768, 1024 for SDXL); SD and SDXL UNets take multiples of 64 (8 x their 3 downsamplings): an "
         "image of another size fails with a message, the others go on"},
        {"height", 0, SD_OPT_INT, &height, "PX", "image height, the same way"},
        {"device", 0, SD_OPT_STR, &o.device, "DEV", "cpu (default) or cuda:K: everything on GPU K"},
        {"threads", 'j', SD_OPT_INT, &threads, "N", "CPU threads (default: all CPUs); the images do not depend on it"},
        {"overwrite", 0, SD_OPT_FLAG, &o.overwrite, NULL,
         "replace images (and DIR/contact.png) an earlier run left in DIR; without it or --skip-existing a run "
         "whose outputs are there already is refused (exit 2) before the model is loaded"},
        {"skip-existing", 0, SD_OPT_FLAG, &o.skip_existing, NULL,
         "keep the images already in DIR (as they are: their settings are not compared) and render only the "
         "missing ones, so a killed run rerun with the same command goes on where it stopped; the contact sheet "
         "shows them all"},
        {"no-contact-sheet", 0, SD_OPT_FLAG, &no_contact, NULL, "do not write DIR/contact.png"},
        {"strict", 0, SD_OPT_FLAG, &o.strict, NULL, "exit 1 when a line was skipped too (an image that failed always gives exit 1)"},
        {"quiet", 'q', SD_OPT_FLAG, &quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &verbose, NULL, "debug messages"},
        {NULL, 0, 0, NULL, NULL, NULL}};
    sd_cli cli = {"sd-sample", "[OPTIONS] --model PATH (--prompts FILE.jsonl | --prompt TEXT) -o DIR",
                  "Render prompts with a Stable Diffusion model folder or single file (SD 1.x, SD 2.x epsilon or v, SDXL with its added "
                  "size conditioning) as diffusers' pipelines do: the text encoder(s), the initial latents from "
                  "torch's CPU generator for the seed (times the scheduler's init_noise_sigma; Euler a's noise "
                  "continues the same generator), the sampler with classifier-free guidance, the VAE decoder. "
                  "Each line of --prompts (or the one --prompt) gives DIR/NNNNN.png, NNNNN the line's 0-based "
                  "number, holding its settings in a `parameters` text chunk as A1111 writes it, and DIR/contact.png "
                  "shows them all in a grid (not written when no image was). A bad line (named by its number; a key "
                  "other than those of --prompts included) is skipped and counted; a line without \"prompt\" is "
                  "rendered unconditional with a warning; an image whose latents become non-finite (the step "
                  "named) fails alone; the run goes on and ends with a summary by reason. Every file is written "
                  "whole or not at all; an earlier run's files in DIR are never replaced without --overwrite "
                  "(--skip-existing keeps them and renders the rest). Exit 1 when an image "
                  "failed (or, with --strict, a line was skipped).",
                  opts,
                  "Examples:\n"
                  "  sd-sample --model sd15/ --prompt 'a red bicycle' --seed 1 -o out/\n"
                  "  sd-sample --model sdxl/ --prompts prompts.jsonl -o samples/ --device cuda:0\n"
                  "  sd-sample --model sdxl/ --prompts prompts.jsonl -o samples/ --skip-existing   # after a kill\n"
                  "  sd-sample --model v1-5-pruned-emaonly.safetensors --tokenizer sd15/ --prompt 'a cat' -o out/\n"
                  "  sd-sample --model sd15-tags/ --max-tokens 150 --prompts tags.jsonl -o out/   # trained on "
                  "sd-latents --max-tokens 150 shards\n"
                  "  prompts.jsonl:  {\"prompt\": \"a cat\", \"negative\": \"blurry\", \"seed\": 4, \"steps\": 30, "
                  "\"cfg\": 6.5, \"sampler\": \"euler_a\", \"width\": 768, \"height\": 512}\n",
                  "0 ok, 1 an image failed (or, with --strict, a line was skipped), 2 usage error (outputs already "
                  "there included), 3 fatal error."};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) return rc;
    sd_log_setup("sd-sample", quiet ? SD_LOG_WARN : verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    const char *bad = NULL;
    char msg[256];
    sd_error e = {0};
    if (pos.n) bad = "no positional arguments (the prompts come from --prompts or --prompt)";
    else if (!o.src.path) bad = "no model (--model PATH)";
    else if (o.src.prediction && strcmp(o.src.prediction, "epsilon") && strcmp(o.src.prediction, "v_prediction"))
        bad = "--prediction: expected epsilon or v_prediction";
    else if (!o.output) bad = "no output folder (-o DIR)";
    else if (!o.prompts && !o.defaults.prompt) bad = "nothing to render: give --prompts FILE.jsonl or --prompt TEXT";
    else if (o.prompts && o.defaults.prompt)
        bad = "--prompt and --prompts together: a line without \"prompt\" would silently take --prompt; use one";
    else if (seed < 0 || (double)seed > SD_SAMPLE_SEED_MAX) bad = "--seed must be 0..2^53-1";
    else if (steps < 1 || steps > 1000) bad = "--steps must be 1..1000";
    else if (!(cfg >= 0 && cfg <= 100)) bad = "--cfg must be a number from 0 to 100";
    else if ((width && !sd_sample_size_ok(width)) || (height && !sd_sample_size_ok(height)))
        bad = "--width and --height must be multiples of 8 from 8 to 8192";
    else if (threads < 0 || threads > 1024) bad = "--threads must be 0..1024";
    else if (o.overwrite && o.skip_existing) bad = "--overwrite and --skip-existing together: pick one";
    else if (max_tokens != 75 && max_tokens != 150 && max_tokens != 225) bad = "--max-tokens must be 75, 150 or 225";
    else if (sd_sampler_parse(sampler, &o.defaults.sampler, &e)) {
        snprintf(msg, sizeof msg, "%.250s", e.msg); /* names the sampler: short */
        bad = msg;
    }
    else if (sd_cli_parse_device(o.device, &o.cuda_device)) bad = "--device: expected cpu or cuda:K";
    sd_strlist_free(&pos);
    if (bad) {
        sd_cli_usage_error(&cli, "%s", bad);
        return SD_EXIT_USAGE;
    }
    o.src.max_tokens = (int)max_tokens;
    o.defaults.seed = (uint64_t)seed;
    o.defaults.steps = (int)steps;
    o.defaults.cfg = cfg;
    o.defaults.width = (int)width;
    o.defaults.height = (int)height;
    o.threads = threads > 0 ? (int)threads : sd_default_threads();
    o.quiet = quiet;
    o.contact = !no_contact;
    return sample_run(&o);
}
