// The head sizes the attention kernels are compiled for, listed once for decode
// (paged_attention.cpp) and prefill (paged_prefill.cpp) so the two accept the same models;
// CpuPagedBackend (backend.py) declares this list to core.
// A head size is a template argument: the loops over a head's D values then have a trip
// count the compiler knows, which it unrolls and keeps in vector registers.
//
// CORE_FOR_EACH_HEAD_SIZE(M) expands M(D) once per size, e.g. into a switch's cases.

#pragma once

#define CORE_FOR_EACH_HEAD_SIZE(M) M(16) M(32) M(64) M(80) M(96) M(128) M(256)
