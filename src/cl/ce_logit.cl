/*
 * ce_logit.cl: the cross-entropy's per-logit rules, a prelude of the two families that apply
 * them (the runtime puts it after common.cl, src/runtime/program.c's family table):
 * cross_entropy.cl and the logits products' epilogues in matmul.cl (MM_CE). The formulas are in
 * cross_entropy.cl's header. Options are runtime flags; CAP and CAP_DERIV read the caller's
 * `flags` and `cap`.
 */
#define CE_WEIGHT 1
#define CE_SMOOTH 2
#define CE_CAP 4
#define CE_BIAS 8

#define CAP(x) ((flags & CE_CAP) ? cap * tanh((x) * (1.0f / cap)) : (x))
#define CAP_DERIV(xc) ((flags & CE_CAP) ? 1.0f - ((xc) / cap) * ((xc) / cap) : 1.0f)

/* dlogit of the capped logit xc from e = exp(xc - lse_p): A e - B [target] - C w, q = (A, B, C). */
inline float ce_dlogit_e(int flags, float cap, float xc, float e, float3 q, float w, bool target)
{
    float g = q.x * e - q.z * w;
    if (target)
        g -= q.y;
    return g * CAP_DERIV(xc);
}

/* The same with the exponential taken here, lp the row's lse_p. */
inline float ce_dlogit(int flags, float cap, float xc, float3 q, float lp, float w, bool target)
{
    return ce_dlogit_e(flags, cap, xc, exp(xc - lp), q, w, target);
}
