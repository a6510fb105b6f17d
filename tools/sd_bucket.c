/* sd-bucket: assign every metadata record an aspect-ratio bucket, the resize
 * and the crop, report the bucket distribution, and optionally split the
 * records into balanced parts. The run, the parts and the report live in
 * tools/bucket/; this file is the command line and the plan it asks for. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "bucket_split.h"
#include "bucket_tool.h"
#include "cli.h"
#include "err.h"
#include "log.h"
#include "outfile.h"
#include "progress.h"

/* Say which given options the chosen plan does not use, rather than
 * ignore them without a word (the defaults are those of main). */
static void warn_unused(const bucket_opts *o, const char *plan)
{
    int kohya = strcmp(plan, "kohya") == 0, multires = strcmp(plan, "multires") == 0;
    const struct {
        int given, used;
        const char *name;
    } opts[] = {
        {strcmp(o->resolution, "1024x1024") != 0, kohya, "--resolution"},
        {o->steps != 64, kohya || multires, "--steps"},
        {o->min_bucket != 256 || o->max_bucket != 2048, kohya, "--min-bucket/--max-bucket"},
        {o->no_upscale, !multires, "--no-upscale"},
        {o->upscale, multires, "--upscale"},
        {o->min_res || o->max_res, multires, "--min-res/--max-res"},
        {o->buckets != NULL, strcmp(plan, "list") == 0, "--buckets"},
    };
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++)
        if (opts[i].given && !opts[i].used) sd_log(SD_LOG_WARN, "%s does nothing with --plan %s", opts[i].name, plan);
}

/* Latents are an eighth of the image on each side: a bucket side that is
 * not a multiple of 8 could never be encoded (sd-latents skips it). */
static const char *not_eighths(const sd_plan *p)
{
    if ((p->kind == SD_PLAN_KOHYA || p->kind == SD_PLAN_MULTIRES) && p->steps % 8)
        return "--steps must be a multiple of 8 (latents are 1/8 of the image per side)";
    for (size_t i = 0; i < p->n; i++)
        if (p->resos[i].w % 8 || p->resos[i].h % 8)
            return "every bucket side must be a multiple of 8 (latents are 1/8 of the image per side)";
    return NULL;
}

/* Build the bucket plan the options ask for; a usage error on bad values. */
static int make_plan(const sd_cli *cli, const bucket_opts *o, sd_plan *p)
{
    sd_error err;
    sd_err_clear(&err);
    sd_status st;
    const char *name = o->plan;
    if (!name) name = o->buckets ? "list" : (o->min_res || o->max_res) ? "multires" : "kohya";
    warn_unused(o, name);
    if (strcmp(name, "kohya") == 0) {
        sd_reso r;
        const char *end;
        if (sd_parse_reso(o->resolution, &end, &r) != 0 || *end) {
            sd_cli_usage_error(cli, "--resolution needs WxH, got '%s'", o->resolution);
            return SD_EXIT_USAGE;
        }
        st = sd_plan_kohya(p, r.w, r.h, (int)o->min_bucket, (int)o->max_bucket, (int)o->steps, o->no_upscale, &err);
    } else if (strcmp(name, "sdxl") == 0) {
        st = sd_plan_sdxl(p, o->no_upscale, &err);
    } else if (strcmp(name, "list") == 0) {
        if (!o->buckets) {
            sd_cli_usage_error(cli, "--plan list needs --buckets WxH,...");
            return SD_EXIT_USAGE;
        }
        st = sd_plan_list(p, o->buckets, o->no_upscale, &err);
    } else if (strcmp(name, "multires") == 0) {
        st = sd_plan_multires(p, o->min_res ? (int)o->min_res : 512, o->max_res ? (int)o->max_res : 1024, (int)o->steps,
                              o->upscale, &err);
    } else {
        sd_cli_usage_error(cli, "unknown --plan '%s' (kohya, sdxl, list, multires)", name);
        return SD_EXIT_USAGE;
    }
    if (st) {
        sd_cli_usage_error(cli, "%s", err.msg);
        return SD_EXIT_USAGE;
    }
    const char *bad = not_eighths(p);
    if (bad) {
        sd_plan_free(p);
        sd_cli_usage_error(cli, "%s", bad);
        return SD_EXIT_USAGE;
    }
    /* only for a plan that is used: a refused one needs no adjusting note */
    if (strcmp(name, "kohya") == 0 && (o->min_bucket != p->min_size || o->max_bucket != p->max_size))
        sd_log(SD_LOG_WARN, "bucket sizes adjusted to multiples of %ld: min %d, max %d", o->steps, p->min_size,
               p->max_size);
    return -1;
}

/* The --report and --plot files are written after the records, which are
 * published first: a path that cannot be written (a missing directory) is
 * found before any work, by making and dropping a temporary file beside it,
 * so a failed run leaves no new -o behind. */
static sd_status side_outputs_writable(const bucket_opts *o, sd_error *err)
{
    const char *paths[2] = {o->report, o->plot};
    for (int i = 0; i < 2; i++) {
        if (!paths[i]) continue;
        sd_outfile probe = {0};
        sd_status st = sd_outfile_open(&probe, paths[i], err);
        if (st) return st;
        sd_outfile_abort(&probe);
    }
    return SD_OK;
}

/* Options, the bucket plan, then every input file through the run into stdout, -o, or --split's
 * parts and their manifest. */
int main(int argc, char **argv)
{
    /* split LONG_MIN: not given, so that an explicit --split 0 is refused */
    bucket_opts o = {.plan = NULL, .resolution = "1024x1024", .min_bucket = 256, .max_bucket = 2048, .steps = 64,
                     .split = LONG_MIN};
    const sd_opt opts[] = {
        {"plan", 0, SD_OPT_STR, &o.plan, "NAME", "bucket plan: kohya, sdxl, list, multires (default: list with --buckets, multires with --min-res/--max-res, else kohya)"},
        {"resolution", 'r', SD_OPT_STR, &o.resolution, "WxH", "kohya: max resolution (default 1024x1024)"},
        {"min-bucket", 0, SD_OPT_INT, &o.min_bucket, "N", "kohya: smallest bucket side (default 256)"},
        {"max-bucket", 0, SD_OPT_INT, &o.max_bucket, "N", "kohya: largest bucket side (default 2048)"},
        {"steps", 0, SD_OPT_INT, &o.steps, "N", "kohya/multires: bucket sides are multiples of N, itself a multiple of 8 (default 64)"},
        {"no-upscale", 0, SD_OPT_FLAG, &o.no_upscale, NULL,
         "kohya: bucket_no_upscale; sdxl/list: skip images that would need enlarging"},
        {"buckets", 0, SD_OPT_STR, &o.buckets, "LIST", "list plan: buckets as WxH,WxH,..."},
        {"min-res", 0, SD_OPT_INT, &o.min_res, "R", "multires: smallest training area R*R (default 512)"},
        {"max-res", 0, SD_OPT_INT, &o.max_res, "R", "multires: largest training area R*R (default 1024)"},
        {"upscale", 0, SD_OPT_FLAG, &o.upscale, NULL, "multires: upscale images below min-res instead of skipping"},
        {"read-sizes", 0, SD_OPT_FLAG, &o.read_sizes, NULL,
         "read every image's size from its header, also where the record has width/height (wrong or stale ones)"},
        {"root", 0, SD_OPT_STR, &o.root, "DIR", "resolve relative image paths against DIR (default: current dir)"},
        {"split", 0, SD_OPT_INT, &o.split, "N", "write N bucket-balanced parts (-o must hold %d) and, last, their manifest (PATTERN.parts.json beside part 0)"},
        {"output", 'o', SD_OPT_STR, &o.output, "FILE", "output JSONL (default stdout); with --split a pattern like part-%d.jsonl"},
        {"seed", 0, SD_OPT_INT, &o.seed, "N", "seed for the split's part rotation (default 0)"},
        {"report", 0, SD_OPT_STR, &o.report, "FILE", "write a JSON report of buckets and skips"},
        {"plot", 0, SD_OPT_STR, &o.plot, "FILE", "write an SVG bar chart of bucket counts"},
        {"threads", 'j', SD_OPT_INT, &o.threads, "N", "worker threads (default: all CPUs)"},
        {"strict", 0, SD_OPT_FLAG, &o.strict, NULL, "exit 1 if any record was skipped"},
        {"allow-empty", 0, SD_OPT_FLAG, &o.allow_empty, NULL, "when no record is bucketed (an empty input, or every record skipped), write the empty output and exit 0 (default: an error, -o and the parts left as they were, exit 1)"},
        {"quiet", 'q', SD_OPT_FLAG, &o.quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &o.verbose, NULL, "more detail; show every skipped record"},
        {NULL, 0, 0, NULL, NULL, NULL},
    };
    const sd_cli cli = {
        "sd-bucket", "[OPTIONS] [FILE.jsonl...]",
        "Assign each metadata record (JSONL, from sd-meta) an aspect-ratio bucket, the resize and the crop.\n"
        "Adds width/height (if missing, read from the image header; with --read-sizes always), original_size,\n"
        "bucket, resize, crop (the box actually cut from the resized image: SDXL crop_coords_top_left =\n"
        "(crop[1], crop[0])) and kohya_crop_ltrb (sd-scripts' letterbox values). Reads stdin when no FILE or\n"
        "'-' is given.",
        opts,
        "Plans:\n"
        "  kohya     sd-scripts make_bucket_resolutions/select_bucket, bit-compatible (but for EXIF-rotated\n"
        "            images: sdtk buckets the displayed size, sd-scripts the stored one). sd-scripts' own CLI\n"
        "            defaults are --min-bucket 256 --max-bucket 1024; 2048 here admits the SDXL-style wide buckets.\n"
        "  sdxl      the 41 SDXL training resolutions; nearest aspect, ties to the first in (w,h) order.\n"
        "  list      --buckets WxH,...; chosen like sdxl.\n"
        "  multires  each image keeps its aspect; its area is clamped into [min-res^2, max-res^2]\n"
        "            (larger: downscaled; smaller: skipped, or upscaled with --upscale); the bucket is the\n"
        "            resized size floored to --steps, so under --steps px per axis are cropped.\n"
        "Examples:\n"
        "  sd-bucket meta.jsonl -o bucketed.jsonl --report buckets.json --plot buckets.svg\n"
        "  sd-bucket --plan sdxl --split 8 -o 'part-%d.jsonl' meta.jsonl", NULL};
    sd_strlist files = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &files);
    if (rc >= 0) {
        sd_strlist_free(&files);
        return rc;
    }
    sd_log_setup("sd-bucket", o.quiet ? SD_LOG_WARN : o.verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    if (o.split != LONG_MIN && (o.split < 1 || o.split > 10000)) {
        sd_cli_usage_error(&cli, "--split must be 1..10000");
        sd_strlist_free(&files);
        return SD_EXIT_USAGE;
    }
    if (o.split == LONG_MIN) o.split = 0;
    if (o.split > 0 && (!o.output || !sd_part_pattern_ok(o.output))) {
        sd_cli_usage_error(&cli, "--split needs -o with exactly one %%d, e.g. -o 'part-%%d.jsonl'");
        sd_strlist_free(&files);
        return SD_EXIT_USAGE;
    }
    if (o.threads < 0) {
        sd_cli_usage_error(&cli, "--threads must be positive");
        sd_strlist_free(&files);
        return SD_EXIT_USAGE;
    }
    bucket_run r;
    memset(&r, 0, sizeof r);
    rc = make_plan(&cli, &o, &r.plan);
    if (rc >= 0) {
        sd_strlist_free(&files);
        return rc;
    }
    if (files.n == 0) sd_strlist_push(&files, "-");

    sd_error err;
    sd_err_clear(&err);
    sd_outfile out = {0};
    sd_status st = side_outputs_writable(&o, &err);
    if (!st) st = bucket_run_init(&r, &o, &err);
    if (!st) {
        if (o.split > 0) {
            st = bucket_open_parts(&r, &err);
        } else {
            sd_outfile_warn_own_leftovers(o.output);
            st = sd_outfile_open(&out, o.output, &err);
            r.sink = out.f;
            r.out_file = &out;
        }
    }
    for (int i = 0; !st && i < files.n; i++) st = bucket_run_file(&r, files.v[i], &err);
    sd_progress_finish(&r.prog);
    /* no record out (an empty input, every record skipped): an empty output
     * must not replace a good one unnoticed, as in sd-meta */
    int none = !st && r.out == 0 && !o.allow_empty;
    if (o.split > 0) {
        sd_status cst = bucket_close_parts(&r, none ? SD_EINVAL : st, &err); /* none: the parts dropped */
        if (!none) st = cst;
    } else if (out.f) {
        if (!st && !none) st = sd_outfile_commit(&out, &err);
        else sd_outfile_abort(&out);
    }
    if (!st) st = bucket_finish_outputs(&r, r.part_counts, &err); /* the summary by reason, --report, --plot */
    uint64_t skipped = r.tally.total, in = r.in;
    free(r.part_counts);
    bucket_run_free(&r);
    sd_strlist_free(&files);
    if (st) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        return SD_EXIT_FATAL;
    }
    if (none) {
        sd_log(SD_LOG_ERROR, "%s; %s (--allow-empty writes an empty output)",
               in ? "every record was skipped (reasons above)" : "the input holds no records",
               o.output && strcmp(o.output, "-") != 0 ? "-o not written" : "nothing written");
        return SD_EXIT_SKIPPED;
    }
    return o.strict && skipped ? SD_EXIT_SKIPPED : SD_EXIT_OK;
}
