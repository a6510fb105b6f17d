/* sd-verify: the list of problems a check finds, and a record key made
 * printable for their messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify.h"

/* Append a problem; a failed allocation drops it but keeps the count right
 * through the tally. */
void verify_add_problem(problem_list *l, const char *reason, int db, const void *key, size_t klen, const char *name,
                        size_t nlen, const char *fmt, const char *detail)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        problem *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) return;
        l->v = nv;
        l->cap = nc;
    }
    problem *p = &l->v[l->n++];
    memset(p, 0, sizeof *p);
    p->reason = reason;
    p->db = db;
    if (klen && (p->key = malloc(klen))) {
        memcpy(p->key, key, klen);
        p->klen = klen;
    }
    if (name && (p->name = malloc(nlen + 1))) {
        memcpy(p->name, name, nlen);
        p->name[nlen] = 0;
    }
    snprintf(p->detail, sizeof p->detail, fmt, detail);
}

/* Release every problem's key and name, and the list itself. */
void verify_free_problems(problem_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].key);
        free(l->v[i].name);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* Printable key: hex for binary keys, the text itself when printable. */
void verify_key_str(const uint8_t *k, size_t n, char *out, size_t cap)
{
    int text = n > 0;
    for (size_t i = 0; i < n; i++)
        if (k[i] < 0x20 || k[i] > 0x7e || k[i] == '"' || k[i] == '\\') text = 0;
    size_t o = 0;
    if (text) {
        for (size_t i = 0; i < n && o + 1 < cap; i++) out[o++] = (char)k[i];
    } else {
        for (size_t i = 0; i < n && o + 2 < cap; i++) o += (size_t)snprintf(out + o, cap - o, "%02x", k[i]);
    }
    out[o < cap ? o : cap - 1] = 0;
}
