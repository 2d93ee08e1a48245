/*
 * tune_db.h: the tuning database a context consults for kernel tunables (see docs/TUNING.md).
 * Entries come from the built-in files (JSON in data/tuning/, embedded at build time), then from
 * <cache dir>/tuning*.json, then from LLMCL_TUNE_DB, then from llmcl_tune_db_load() and
 * llmcl_tune_override(); the most specific match wins, later sources break ties.
 */
#ifndef LLMCL_TUNE_DB_H
#define LLMCL_TUNE_DB_H

#include "src/runtime/embedded.h"
#include "src/runtime/internal.h"

/* The version of the tuning file format this library reads and the tuner writes. */
#define LLMCL__TUNE_FORMAT "llmcl-tuning"
#define LLMCL__TUNE_VERSION 1

/* The JSON files of data/tuning/, terminated by an entry whose family (the file stem) is NULL. */
extern const llmcl__embedded_source llmcl__embedded_tuning[];

/*
 * Builds ctx's database from the built-in files, the cache directory and LLMCL_TUNE_DB
 * (LLMCL_TUNE_DB=off: none at all). Never fails: bad files become warnings
 * (llmcl_tune_db_warnings) and NULL (out of memory) means no database.
 */
llmcl__tune_db *llmcl__tune_db_create(llmcl_ctx *ctx);

/* Accepts NULL. */
void llmcl__tune_db_destroy(llmcl__tune_db *db);

/*
 * Overwrites the parameters of p (the launcher's heuristic defaults) that the best matching entries
 * set (with overrides_only, llmcl_tune_override's entries alone), and records the result as the
 * values in use for (kernel, dtype, shape_class). The lookup returned names that record for
 * llmcl__tune_db_record.
 */
llmcl__tune_lookup llmcl__tune_db_apply(llmcl_ctx *ctx, const char *kernel, llmcl_dtype dtype,
                                        const char *shape_class, llmcl__params *p,
                                        bool overrides_only);

/* Replaces the values recorded for lookup's key with p (the launcher's final values). */
void llmcl__tune_db_record(const llmcl__tune_lookup *lookup, const llmcl__params *p);

#endif
