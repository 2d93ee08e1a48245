/*
 * glu_ref.h: gated linear units and their activations in double, the CPU reference of glu.cl
 * (shared by tests/test_glu.c and llmcl-bench). act takes llmcl_activation values.
 */
#ifndef LLMCL_GLU_REF_H
#define LLMCL_GLU_REF_H

#include <stddef.h>

#include "llmcl.h"

double glu_ref_act(llmcl_activation act, double x);
double glu_ref_act_grad(llmcl_activation act, double x);

/* o = act(g) * u over n elements; u NULL: o = act(g). */
void glu_ref_forward(llmcl_activation act, const double *g, const double *u, double *o, size_t n);

/*
 * dg = dy * u * act'(g) and du = dy * act(g) over n elements; u NULL: dg = dy * act'(g) and du is
 * not written.
 */
void glu_ref_backward(llmcl_activation act, const double *dy, const double *g, const double *u,
                      double *dg, double *du, size_t n);

#endif
