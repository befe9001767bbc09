/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_KVXFER_H
#define KVX_KVXFER_H
/**
 * @file
 * Umbrella public header of kvxfer: include this one. Each module's public header lives in
 * include/kvxfer/<module>.h (see docs/architecture.md §2 and docs/style.md §8).
 */
#include "kvxfer/common.h"
#if __has_include("kvxfer/lcore.h")
#include "kvxfer/lcore.h"
#endif
#if __has_include("kvxfer/engine.h")
#include "kvxfer/engine.h"
#endif
#endif /* KVX_KVXFER_H */
