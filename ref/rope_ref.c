/* rope_ref.c: see rope_ref.h. Hugging Face's formulas, in double. */
#include "rope_ref.h"

#include <math.h>

#define REF_PI 3.14159265358979323846

void rope_ref_inv_freq(double *inv, int64_t rotary_dim, double theta, const rope_ref_llama3 *l3)
{
    for (int64_t i = 0; i < rotary_dim / 2; ++i) {
        double f = 1.0 / pow(theta, (double)(2 * i) / (double)rotary_dim);
        if (l3 && l3->factor > 0.0) {
            const double low_wl = l3->original_max_position / l3->low_freq_factor;
            const double high_wl = l3->original_max_position / l3->high_freq_factor;
            const double wavelen = 2.0 * REF_PI / f;
            if (wavelen > low_wl) {
                f /= l3->factor;
            } else if (wavelen >= high_wl) {
                const double smooth = (l3->original_max_position / wavelen - l3->low_freq_factor) /
                                      (l3->high_freq_factor - l3->low_freq_factor);
                f = (1.0 - smooth) * f / l3->factor + smooth * f;
            }
        }
        inv[i] = f;
    }
}

void rope_ref_tables(double *cos_t, double *sin_t, const double *pos, int64_t n, const double *inv,
                     int64_t pairs, int f32_angle)
{
    for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < pairs; ++i) {
            double a = pos[j] * inv[i];
            if (f32_angle)
                a = (float)((float)pos[j] * (float)inv[i]);
            cos_t[j * pairs + i] = cos(a);
            sin_t[j * pairs + i] = sin(a);
        }
}

void rope_ref_apply(double *x, int64_t B, int64_t H, int64_t T, int64_t D, int64_t rotary_dim,
                    int interleaved, const double *cos_t, const double *sin_t, int batch_tables,
                    int inverse)
{
    const int64_t pairs = rotary_dim / 2;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t t = 0; t < T; ++t) {
                double *row = x + ((b * H + h) * T + t) * D;
                const int64_t tab = ((batch_tables ? b * T : 0) + t) * pairs;
                for (int64_t i = 0; i < pairs; ++i) {
                    const double c = cos_t[tab + i], s = inverse ? -sin_t[tab + i] : sin_t[tab + i];
                    double *px = interleaved ? row + 2 * i : row + i;
                    double *py = interleaved ? row + 2 * i + 1 : row + i + pairs;
                    const double xv = *px, yv = *py;
                    *px = xv * c - yv * s;
                    *py = yv * c + xv * s;
                }
            }
}
