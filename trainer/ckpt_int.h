/* Inside sdtrain only: what the checkpoint files share (ckpt_save.c:
 * writing, pruning; ckpt_resume.c: finding and reading). */
#ifndef SDTK_CKPT_INT_H
#define SDTK_CKPT_INT_H

enum { PATH_CAP = 4096 };

/* The file every checkpoint directory the trainer writes carries first. */
static const char CKPT_MARK[] = ".sdtk-checkpoint";

/* dir/name into buf (PATH_CAP bytes); callers check their directory's
 * length first, so nothing is cut. */
void sd_train_pjoin(char *buf, const char *dir, const char *name);
/* The step of a "checkpoint-<digits>" name, -1 for anything else. */
long sd_train_ckpt_step(const char *name);
/* Whether out/name is a whole checkpoint: its state file is there (saves
 * write it before the rename, prunes remove it first). */
int sd_train_ckpt_whole(const char *out, const char *name);
/* Whether dir is a checkpoint this trainer wrote (its mark, or an sdtk
 * training state): the only kind pruning and replacing touch. */
int sd_train_ckpt_owned(const char *dir);

/* ckpt_samples.c: whether name is base + ".tmp." + 6 characters (the
 * name sd_outfile writes base under until it renames it, left by a kill). */
int sd_train_is_temp_of(const char *name, const char *base);
/* dir/sub's sample images removed (checkpoint-N/samples/ when the
 * checkpoint goes), the folder too when nothing else is in it. */
void sd_train_remove_samples(const char *dir, const char *sub);
/* out/samples/step-N and out/samples-ema/step-N removed so for every
 * N < before (the oldest checkpoint --keep leaves). */
void sd_train_prune_step_samples(const char *out, long before);

#endif
