/*
 * checkpoint.c: sharded checkpoints that reshard. Every rank writes its flat f32 shard of master,
 * m and v as one safetensors file; rank 0 writes manifest.json with the layout that produced them
 * (each parameter's group and offset, each group's padded size, the world size) and each file's
 * size and xxHash64. A load on any world size and stage maps a parameter's elements through the old
 * layout to (old rank, position in its shard) and copies the runs it needs out of the mapped files.
 * A load validates and reads everything into host buffers on every rank, then the ranks agree,
 * and only then is device state replaced: a bad checkpoint changes nothing.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "dist.h"

#define FORMAT "llmcl-dist-checkpoint"
#define VERSION 1
#define PATH_LEN 4096
#define DIR_LEN 4000 /* a folder's path, so that a file's name fits after it */

static void shard_path(char *out, const char *dir, int rank)
{
    snprintf(out, PATH_LEN, "%s/shard-%05d.safetensors", dir, rank);
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *at)
{
    (void)sb, (void)type, (void)at;
    remove(path);
    return 0;
}

/* Removes a folder and everything in it, the application's sub-folders too (FTW_DEPTH: a
   folder's contents before the folder; FTW_PHYS: links removed, not followed). Missing is fine. */
static void remove_folder(const char *dir)
{
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Flushes a file's or a folder's contents to disk (a folder's: the names in it): 0 or errno. */
static int flush(const char *path)
{
    const int fd = open(path, O_RDONLY);
    if (fd < 0)
        return errno;
    const int err = fsync(fd) == 0 ? 0 : errno;
    close(fd);
    return err;
}

static llmcl_status sync_path(llmcl_ctx *ctx, const char *path)
{
    const int err = flush(path);
    LLMCL__REQUIRE(ctx, err == 0, LLMCL_ERROR_IO, "cannot flush '%s' to disk: %s", path,
                   strerror(err));
    return LLMCL_OK;
}

/* nftw's callbacks take no argument of the caller's: where sync_entry failed, and why. */
static _Thread_local char sync_failed[PATH_LEN];
static _Thread_local int sync_errno;

/* Flushes a file, or a folder once its contents are (FTW_DEPTH). Links (FTW_PHYS: not followed)
   and special files hold no data of the checkpoint, and a FIFO's open would block. */
static int sync_entry(const char *path, const struct stat *sb, int type, struct FTW *at)
{
    (void)at;
    int err = 0;
    if (type == FTW_NS || type == FTW_DNR)
        err = errno ? errno : EACCES;
    else if (S_ISREG(sb->st_mode) || S_ISDIR(sb->st_mode))
        err = flush(path);
    if (err) {
        snprintf(sync_failed, sizeof sync_failed, "%s", path);
        sync_errno = err;
    }
    return err;
}

/* Every file of a folder and of its sub-folders, then each folder, flushed to disk: whatever the
   application added too. */
static llmcl_status sync_folder(llmcl_ctx *ctx, const char *dir)
{
    sync_errno = 0;
    const int rc = nftw(dir, sync_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (rc == 0)
        return LLMCL_OK;
    if (sync_errno == 0) /* nftw's own failure, dir itself unreadable say */
        return LLMCL__FAIL(ctx, LLMCL_ERROR_IO, "cannot open '%s': %s", dir, strerror(errno));
    return LLMCL__FAIL(ctx, LLMCL_ERROR_IO, "cannot flush '%s' to disk: %s", sync_failed,
                       strerror(sync_errno));
}

/* dir without its trailing slashes ("ck/" names ck, whose siblings are ck.tmp and ck.old);
   false for NULL, "" or a path too long for them. */
static bool folder_path(const char *dir, char out[DIR_LEN])
{
    if (!dir || !dir[0] || strlen(dir) + 8 > DIR_LEN)
        return false;
    snprintf(out, DIR_LEN, "%s", dir);
    for (size_t n = strlen(out); n > 1 && out[n - 1] == '/';)
        out[--n] = '\0';
    return true;
}

/* The folder that holds path ("." for a bare name). */
static void parent_folder(const char *path, char out[PATH_LEN])
{
    char copy[PATH_LEN];
    snprintf(copy, sizeof copy, "%s", path); /* dirname may write into its argument */
    snprintf(out, PATH_LEN, "%s", dirname(copy));
}

/*
 * A test hook: LLMCL_TEST_SAVE_STOP=<stage> kills the process (SIGKILL, as a job killed while
 * saving) when a save reaches that stage, so that tests can check what a resume finds at each
 * (include/llmcl_dist.h lists the stages).
 */
static void save_stage(const char *stage)
{
    const char *stop = getenv("LLMCL_TEST_SAVE_STOP");
    if (stop && strcmp(stop, stage) == 0)
        raise(SIGKILL);
}

/* The size and xxHash64 of a whole file. The buffer is the call's own: saves and loads of other
   dists may hash on other threads. */
static llmcl_status file_hash(llmcl_ctx *ctx, const char *path, uint64_t *bytes, uint64_t *hash)
{
    enum { BUF_BYTES = 1 << 16 };
    FILE *f = fopen(path, "rb");
    LLMCL__REQUIRE(ctx, f, LLMCL_ERROR_IO, "cannot open '%s': %s", path, strerror(errno));
    XXH64_state_t *s = XXH64_createState();
    char *buf = malloc(BUF_BYTES);
    llmcl_status st = s && buf ? LLMCL_OK
                               : LLMCL__FAIL(ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "hashing '%s'",
                                             path);
    if (st == LLMCL_OK) {
        XXH64_reset(s, 0);
        *bytes = 0;
        for (size_t n; (n = fread(buf, 1, BUF_BYTES, f)) > 0;) {
            XXH64_update(s, buf, n);
            *bytes += n;
        }
        *hash = XXH64_digest(s);
        if (ferror(f))
            st = LLMCL__FAIL(ctx, LLMCL_ERROR_IO, "cannot read '%s'", path);
    }
    fclose(f);
    free(buf);
    XXH64_freeState(s);
    return st;
}

/* ---- save ---- */

static llmcl_status write_shard(llmcl_dist *d, const char *dir, uint64_t out[2])
{
    char path[PATH_LEN];
    shard_path(path, dir, d->rank);
    llmcl_safetensors_writer *w = NULL;
    llmcl_status st = llmcl_safetensors_writer_create(path, &w);
    if (st == LLMCL_OK)
        st = llmcl_safetensors_writer_add_tensor(w, "master", d->master);
    if (st == LLMCL_OK)
        st = llmcl_safetensors_writer_add_tensor(w, "m", d->m);
    if (st == LLMCL_OK)
        st = llmcl_safetensors_writer_add_tensor(w, "v", d->v);
    if (st == LLMCL_OK)
        st = llmcl_safetensors_writer_finish(w);
    llmcl_safetensors_writer_destroy(w);
    if (st != LLMCL_OK) /* the writer reports to the thread's slot; keep it on the context */
        return LLMCL__FAIL(d->ctx, st, "%s", llmcl_last_error(NULL));
    return file_hash(d->ctx, path, &out[0], &out[1]);
}

static json_t *manifest(const llmcl_dist *d, const uint64_t *files)
{
    const llmcl_adamw_opts *o = &d->last;
    json_t *root = json_object(), *params = json_array(), *groups = json_array(),
           *shards = json_array();
    json_object_set_new(root, "format", json_string(FORMAT));
    json_object_set_new(root, "version", json_integer(VERSION));
    json_object_set_new(root, "world_size", json_integer(d->world));
    json_object_set_new(root, "stage", json_integer(d->opts.stage));
    json_object_set_new(root, "param_dtype", json_string(llmcl_dtype_name(d->opts.param_dtype)));
    json_object_set_new(root, "reduce_dtype", json_string(llmcl_dtype_name(d->opts.reduce_dtype)));
    json_object_set_new(root, "step", json_integer(o->step));
    json_object_set_new(root, "optimizer",
                        json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "lr", (double)o->lr,
                                  "beta1", (double)o->beta1, "beta2", (double)o->beta2, "eps",
                                  (double)o->eps, "weight_decay", (double)o->weight_decay,
                                  "grad_scale", (double)o->grad_scale, "max_grad_norm",
                                  (double)o->max_grad_norm));
    for (int k = 0; k < d->n_groups; ++k)
        json_array_append_new(groups, json_pack("{s:I}", "numel", (json_int_t)d->groups[k].numel));
    for (int i = 0; i < d->n_params; ++i) {
        const dist_param *p = &d->params[i];
        json_t *shape = json_array();
        for (int k = 0; k < p->ndim; ++k)
            json_array_append_new(shape, json_integer(p->shape[k]));
        json_array_append_new(params, json_pack("{s:s, s:o, s:i, s:I, s:b}", "name", p->name,
                                                "shape", shape, "group", p->group, "offset",
                                                (json_int_t)p->offset, "no_weight_decay",
                                                p->no_weight_decay));
    }
    for (int r = 0; r < d->world; ++r) {
        char name[64], hash[32];
        snprintf(name, sizeof name, "shard-%05d.safetensors", r);
        snprintf(hash, sizeof hash, "%016" PRIx64, files[2 * r + 1]);
        json_array_append_new(shards, json_pack("{s:s, s:I, s:s}", "file", name, "bytes",
                                                (json_int_t)files[2 * r], "xxh64", hash));
    }
    json_object_set_new(root, "groups", groups);
    json_object_set_new(root, "params", params);
    json_object_set_new(root, "shards", shards);
    return root;
}

/* Rank 0: the manifest into tmp, flushed to disk. */
static llmcl_status write_manifest(llmcl_dist *d, const char *tmp, const uint64_t *files)
{
    char path[PATH_LEN];
    json_t *root = manifest(d, files);
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    const int rc = json_dump_file(root, path, JSON_INDENT(1));
    json_decref(root);
    LLMCL__REQUIRE(d->ctx, rc == 0, LLMCL_ERROR_IO, "cannot write '%s'", path);
    return sync_path(d->ctx, path);
}

/*
 * Rank 0: tmp, complete, becomes dir. dir, when it exists, is always a whole checkpoint (only this
 * rename makes it), so a leftover dir.old beside it is stale; without dir, dir.old is the whole
 * checkpoint of a commit that stopped between its renames, and stays until tmp is in place.
 */
static llmcl_status commit(llmcl_dist *d, const char *dir, const char *tmp)
{
    char old[PATH_LEN], parent[PATH_LEN];
    snprintf(old, sizeof old, "%s.old", dir);
    parent_folder(dir, parent);
    LLMCL__TRY(sync_folder(d->ctx, tmp));
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        remove_folder(old);
        LLMCL__REQUIRE(d->ctx, rename(dir, old) == 0, LLMCL_ERROR_IO,
                       "cannot move the old '%s' aside: %s", dir, strerror(errno));
        LLMCL__TRY(sync_path(d->ctx, parent));
        save_stage("aside");
    }
    LLMCL__REQUIRE(d->ctx, rename(tmp, dir) == 0, LLMCL_ERROR_IO, "cannot rename '%s' to '%s': %s",
                   tmp, dir, strerror(errno));
    LLMCL__TRY(sync_path(d->ctx, parent));
    save_stage("renamed");
    remove_folder(old);
    return LLMCL_OK;
}

/* Whether dir may be replaced by a save: absent, empty, or a checkpoint (what a save removes). */
static bool replaceable(const char *dir)
{
    struct stat sb;
    char path[PATH_LEN];
    if (stat(dir, &sb) != 0)
        return true;
    if (!S_ISDIR(sb.st_mode))
        return false;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (stat(path, &sb) == 0)
        return true;
    DIR *dp = opendir(dir);
    int entries = 0;
    for (struct dirent *e; dp && (e = readdir(dp));)
        entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    if (dp)
        closedir(dp);
    return dp && entries == 0;
}

/* Rank 0: a fresh, empty tmp, once dir is known to be replaceable. */
static llmcl_status create_tmp(llmcl_dist *d, const char *dir, const char *tmp)
{
    LLMCL__REQUIRE(d->ctx, replaceable(dir), LLMCL_ERROR_INVALID_ARGUMENT,
                   "'%s' exists and is neither an llmcl_dist checkpoint (no manifest.json) nor "
                   "an empty folder: a save would replace it", dir);
    remove_folder(tmp);
    LLMCL__REQUIRE(d->ctx, mkdir(tmp, 0755) == 0, LLMCL_ERROR_IO, "cannot create '%s': %s", tmp,
                   strerror(errno));
    save_stage("created");
    return LLMCL_OK;
}

/* Every rank's shard checksums to rank 0, which writes the manifest. */
static llmcl_status gather_manifest(llmcl_dist *d, const char *tmp, llmcl_status st,
                                    const uint64_t mine[2])
{
    uint64_t *files = d->rank == 0 ? calloc((size_t)d->world * 2, sizeof *files) : NULL;
    /* Every rank gathers, whatever its state, so that none waits alone. */
    const int rc = MPI_Gather(mine, 2, MPI_UINT64_T, files, 2, MPI_UINT64_T, 0, d->comm);
    if (st == LLMCL_OK && rc != MPI_SUCCESS)
        st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_MPI, "MPI_Gather of the shard checksums");
    if (st == LLMCL_OK && d->rank == 0)
        st = files ? write_manifest(d, tmp, files)
                   : LLMCL__FAIL(d->ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "checksum table");
    if (st == LLMCL_OK && d->rank == 0)
        save_stage("manifest");
    free(files);
    return st;
}

llmcl_status llmcl_dist_save_with(llmcl_dist *d, const char *dir, llmcl_dist_files_fn files,
                                  void *user)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    llmcl_status st = LLMCL_OK;
    char name[DIR_LEN], tmp[DIR_LEN + 8];
    if (!d->ready || !folder_path(dir, name))
        st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                         "llmcl_dist_save needs a set-up dist and a folder path");
    else
        snprintf(tmp, sizeof tmp, "%s.tmp", name);
    if (st == LLMCL_OK)
        st = llmcl__dist_drain(d);
    if (st == LLMCL_OK && d->rank == 0)
        st = create_tmp(d, name, tmp);
    LLMCL__TRY(llmcl__dist_agree(d, st));
    uint64_t mine[2] = {0, 0};
    st = write_shard(d, tmp, mine);
    if (st == LLMCL_OK)
        save_stage("shards");
    st = llmcl__dist_agree(d, st);
    st = llmcl__dist_agree(d, gather_manifest(d, tmp, st, mine));
    if (st == LLMCL_OK && files) {
        st = files(tmp, user);
        if (st != LLMCL_OK)
            LLMCL__FAIL(d->ctx, st, "llmcl_dist_save: the application's files in '%s' failed", tmp);
        else
            save_stage("files");
    }
    st = llmcl__dist_agree(d, st);
    if (st == LLMCL_OK && d->rank == 0)
        st = commit(d, name, tmp);
    if (st != LLMCL_OK && d->rank == 0)
        remove_folder(tmp);
    return llmcl__dist_agree(d, st);
}

llmcl_status llmcl_dist_save(llmcl_dist *d, const char *dir)
{
    return llmcl_dist_save_with(d, dir, NULL, NULL);
}

/* ---- load ---- */

/* The old layout, as the manifest describes it. */
typedef struct old_layout {
    int world, n_groups;
    int64_t *group_shard, *group_shard_off, total_shard;
    llmcl_safetensors **files; /* opened on first need */
    const float *data[3];      /* of the file being read: master, m, v */
    json_t *root;
} old_layout;

#define BAD(d, ...) LLMCL__FAIL((d)->ctx, LLMCL_ERROR_BAD_FILE, __VA_ARGS__)

static llmcl_status read_manifest(llmcl_dist *d, const char *dir, old_layout *L)
{
    char path[PATH_LEN];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    struct stat sb;
    LLMCL__REQUIRE(d->ctx, stat(path, &sb) == 0, LLMCL_ERROR_IO, "cannot open '%s': %s", path,
                   strerror(errno));
    json_error_t err;
    L->root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!L->root)
        return BAD(d, "'%s' is not valid JSON (line %d: %s): truncated or corrupt", path, err.line,
                   err.text);
    const char *format = json_string_value(json_object_get(L->root, "format"));
    if (!format || strcmp(format, FORMAT) != 0 ||
        json_integer_value(json_object_get(L->root, "version")) != VERSION)
        return BAD(d, "'%s' is not an llmcl-dist checkpoint of version %d", path, VERSION);
    /* The manifest carries no checksum of its own: every number is checked before it is cast,
       summed or used to index, so that a damaged one is refused, not read past the files. */
    const json_int_t world = json_integer_value(json_object_get(L->root, "world_size"));
    const json_t *groups = json_object_get(L->root, "groups");
    const json_t *shards = json_object_get(L->root, "shards");
    if (world < 1 || world > INT_MAX || !json_is_array(groups) || !json_is_array(shards) ||
        json_array_size(shards) != (size_t)world || json_array_size(groups) > INT_MAX ||
        !json_is_array(json_object_get(L->root, "params")))
        return BAD(d, "'%s': world_size, groups, params or shards missing or inconsistent", path);
    L->world = (int)world;
    L->n_groups = (int)json_array_size(groups);
    L->group_shard = calloc((size_t)L->n_groups + 1, sizeof *L->group_shard);
    L->group_shard_off = calloc((size_t)L->n_groups + 1, sizeof *L->group_shard_off);
    L->files = calloc((size_t)L->world, sizeof *L->files);
    LLMCL__REQUIRE(d->ctx, L->group_shard && L->group_shard_off && L->files,
                   LLMCL_ERROR_OUT_OF_HOST_MEMORY, "checkpoint layout");
    for (int k = 0; k < L->n_groups; ++k) {
        const json_int_t n = json_integer_value(json_object_get(json_array_get(groups, k), "numel"));
        if (n <= 0 || n % L->world != 0)
            return BAD(d, "'%s': group %d has %lld elements, not a multiple of %d ranks", path, k,
                       (long long)n, L->world);
        L->group_shard[k] = n / L->world;
        if (L->group_shard[k] > INT64_MAX - L->total_shard)
            return BAD(d, "'%s': the groups' shards add up to more than 2^63 elements", path);
        L->group_shard_off[k] = L->total_shard;
        L->total_shard += L->group_shard[k];
    }
    return LLMCL_OK;
}

/* The manifest's entry of p, checked against the registration and the old layout. */
static llmcl_status match_param(llmcl_dist *d, const old_layout *L, const dist_param *p,
                                int *group, int64_t *offset)
{
    const json_t *params = json_object_get(L->root, "params");
    const json_t *e = NULL;
    for (size_t i = 0; !e && i < json_array_size(params); ++i) {
        const char *name = json_string_value(json_object_get(json_array_get(params, i), "name"));
        if (name && strcmp(name, p->name) == 0)
            e = json_array_get(params, i);
    }
    LLMCL__REQUIRE(d->ctx, e, LLMCL_ERROR_INVALID_ARGUMENT,
                   "the checkpoint has no parameter '%s'", p->name);
    const json_t *shape = json_object_get(e, "shape");
    bool same = json_array_size(shape) == (size_t)p->ndim;
    for (int k = 0; same && k < p->ndim; ++k)
        same = json_integer_value(json_array_get(shape, k)) == p->shape[k];
    LLMCL__REQUIRE(d->ctx, same, LLMCL_ERROR_INVALID_ARGUMENT,
                   "'%s' has another shape in the checkpoint", p->name);
    const json_int_t g = json_integer_value(json_object_get(e, "group"));
    *offset = json_integer_value(json_object_get(e, "offset"));
    /* a group's elements, group_shard x world, are its manifest's numel: no overflow */
    if (g < 0 || g >= L->n_groups || *offset < 0 ||
        p->numel > L->group_shard[g] * L->world ||
        *offset > L->group_shard[g] * L->world - p->numel)
        return BAD(d, "'%s': group %lld, offset %" PRId64 " outside the checkpoint's layout",
                   p->name, (long long)g, *offset);
    *group = (int)g;
    return LLMCL_OK;
}

/* Opens old rank r's file once its size and checksum match the manifest. */
static llmcl_status open_shard(llmcl_dist *d, const char *dir, old_layout *L, int r)
{
    if (!L->files[r]) {
        char path[PATH_LEN];
        shard_path(path, dir, r);
        const json_t *e = json_array_get(json_object_get(L->root, "shards"), (size_t)r);
        const uint64_t want = (uint64_t)json_integer_value(json_object_get(e, "bytes"));
        const char *want_hash = json_string_value(json_object_get(e, "xxh64"));
        uint64_t bytes, hash;
        LLMCL__TRY(file_hash(d->ctx, path, &bytes, &hash));
        char got_hash[32];
        snprintf(got_hash, sizeof got_hash, "%016" PRIx64, hash);
        if (bytes != want || !want_hash || strcmp(want_hash, got_hash) != 0)
            return BAD(d, "'%s' is %" PRIu64 " bytes with xxh64 %s; the manifest says %" PRIu64
                       " bytes, %s: truncated or corrupt", path, bytes, got_hash, want,
                       want_hash ? want_hash : "nothing");
        if (llmcl_safetensors_open(path, &L->files[r]) != LLMCL_OK)
            return LLMCL__FAIL(d->ctx, LLMCL_ERROR_BAD_FILE, "%s", llmcl_last_error(NULL));
    }
    static const char *const names[3] = {"master", "m", "v"};
    for (int k = 0; k < 3; ++k) {
        llmcl_safetensors_info info;
        const llmcl_status st = llmcl_safetensors_find(L->files[r], names[k], &info);
        if (st != LLMCL_OK || info.dtype != LLMCL_F32 || info.ndim != 1 ||
            info.shape[0] != L->total_shard)
            return BAD(d, "shard %d: '%s' missing or not f32 [%" PRId64 "]", r, names[k],
                       L->total_shard);
        L->data[k] = info.data;
    }
    return LLMCL_OK;
}

/* Copies p's part of the new shard out of the old files into host[3] (master, m, v). */
static llmcl_status read_param(llmcl_dist *d, const char *dir, old_layout *L, const dist_param *p,
                               float *const host[3])
{
    int og = 0;
    int64_t oo = 0, lo, hi;
    LLMCL__TRY(match_param(d, L, p, &og, &oo));
    if (!llmcl__dist_segment(d, p, &lo, &hi))
        return LLMCL_OK;
    const dist_group *g = &d->groups[p->group];
    for (int64_t e = lo; e < hi;) {
        const int64_t pos = oo + (e - p->offset); /* in the old group */
        const int r = (int)(pos / L->group_shard[og]);
        const int64_t in_r = pos - r * L->group_shard[og];
        int64_t run = L->group_shard[og] - in_r;
        if (run > hi - e)
            run = hi - e;
        LLMCL__TRY(open_shard(d, dir, L, r));
        const int64_t to = g->shard_off + e - d->rank * g->shard;
        for (int k = 0; k < 3; ++k)
            memcpy(host[k] + to, L->data[k] + L->group_shard_off[og] + in_r,
                   (size_t)run * sizeof(float));
        e += run;
    }
    return LLMCL_OK;
}

static void layout_free(old_layout *L)
{
    for (int r = 0; L->files && r < L->world; ++r)
        llmcl_safetensors_close(L->files[r]);
    free(L->files);
    free(L->group_shard);
    free(L->group_shard_off);
    json_decref(L->root);
}

static void read_hyper(const old_layout *L, llmcl_adamw_opts *h)
{
    const json_t *o = json_object_get(L->root, "optimizer");
    memset(h, 0, sizeof *h);
    h->step = json_integer_value(json_object_get(L->root, "step"));
    h->lr = (float)json_number_value(json_object_get(o, "lr"));
    h->beta1 = (float)json_number_value(json_object_get(o, "beta1"));
    h->beta2 = (float)json_number_value(json_object_get(o, "beta2"));
    h->eps = (float)json_number_value(json_object_get(o, "eps"));
    h->weight_decay = (float)json_number_value(json_object_get(o, "weight_decay"));
    h->grad_scale = (float)json_number_value(json_object_get(o, "grad_scale"));
    h->max_grad_norm = (float)json_number_value(json_object_get(o, "max_grad_norm"));
}

/* Everything the new shard needs, read and checked, without touching device state. */
static llmcl_status read_all(llmcl_dist *d, const char *dir, old_layout *L, float *const host[3],
                             llmcl_adamw_opts *hyper)
{
    LLMCL__TRY(read_manifest(d, dir, L));
    LLMCL__REQUIRE(d->ctx, json_array_size(json_object_get(L->root, "params")) == (size_t)d->n_params,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "the checkpoint has %zu parameters; %d are registered",
                   json_array_size(json_object_get(L->root, "params")), d->n_params);
    for (int i = 0; i < d->n_params; ++i)
        LLMCL__TRY(read_param(d, dir, L, &d->params[i], host));
    read_hyper(L, hyper);
    return LLMCL_OK;
}

static llmcl_status upload_all(llmcl_dist *d, float *const host[3])
{
    const size_t bytes = (size_t)d->shard * sizeof(float);
    LLMCL__TRY(llmcl__dist_drain(d));
    LLMCL__TRY(llmcl_tensor_upload(d->master, host[0], bytes));
    LLMCL__TRY(llmcl_tensor_upload(d->m, host[1], bytes));
    LLMCL__TRY(llmcl_tensor_upload(d->v, host[2], bytes));
    return llmcl__dist_refresh_params(d);
}

/* The folder that holds dir's checkpoint: dir, or dir.old where a save stopped between moving
   the old checkpoint aside and renaming the new one into place (commit's comment). */
static const char *checkpoint_folder(const char *dir, char old[DIR_LEN + 8])
{
    struct stat sb;
    snprintf(old, DIR_LEN + 8, "%s.old", dir);
    if (stat(dir, &sb) != 0 && errno == ENOENT && stat(old, &sb) == 0 && S_ISDIR(sb.st_mode))
        return old;
    return dir;
}

llmcl_status llmcl_dist_load_with(llmcl_dist *d, const char *dir, llmcl_adamw_opts *hyper,
                                  llmcl_dist_files_fn files, void *user)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    llmcl_status st = LLMCL_OK;
    char name[DIR_LEN], old[DIR_LEN + 8];
    const int held = llmcl__dist_gathered(d);
    if (!d->ready || !folder_path(dir, name))
        st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                         "llmcl_dist_load needs a set-up dist and a folder path");
    else if (held >= 0) /* the load forgets the gather buffers (stage 3) */
        st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                         "llmcl_dist_load: group %d is still gathered: release it first", held);
    const char *folder = st == LLMCL_OK ? checkpoint_folder(name, old) : NULL;
    if (st == LLMCL_OK && files) {
        st = files(folder, user);
        if (st != LLMCL_OK)
            LLMCL__FAIL(d->ctx, st, "llmcl_dist_load: the application's files in '%s' failed",
                        folder);
    }
    float *host[3] = {NULL, NULL, NULL};
    for (int k = 0; st == LLMCL_OK && k < 3; ++k)
        if (!(host[k] = calloc((size_t)d->shard + 1, sizeof(float))))
            st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "checkpoint buffers");
    old_layout L = {0};
    llmcl_adamw_opts h;
    if (st == LLMCL_OK)
        st = read_all(d, folder, &L, host, &h);
    layout_free(&L);
    st = llmcl__dist_agree(d, st);
    if (st == LLMCL_OK) {
        /* Validated everywhere: from here a failure is the device's, and ends the job. */
        st = llmcl__dist_fault(d, "llmcl_dist_load", upload_all(d, host));
        d->last = h;
        if (hyper)
            *hyper = h;
    }
    for (int k = 0; k < 3; ++k)
        free(host[k]);
    return st;
}

llmcl_status llmcl_dist_load(llmcl_dist *d, const char *dir, llmcl_adamw_opts *hyper)
{
    return llmcl_dist_load_with(d, dir, hyper, NULL, NULL);
}
