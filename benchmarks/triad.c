/* STREAM-style triad a[i] = b[i] + s*c[i] over fp32 arrays, split over `threads` POSIX threads:
   the memory-bandwidth yardstick of benchmarks/fused_adam.py (built and loaded by it with ctypes).
   Plain threads rather than OpenMP: a second OpenMP runtime in torch's process would spin-wait
   on the cores torch's own threads need. */
#include <pthread.h>
#include <stdint.h>

typedef struct {
  float* a;
  const float* b;
  const float* c;
  float s;
  int64_t begin, end;
} Part;

static void* run(void* arg) {
  Part* p = (Part*)arg;
  for (int64_t i = p->begin; i < p->end; ++i) p->a[i] = p->b[i] + p->s * p->c[i];
  return 0;
}

void triad(float* a, const float* b, const float* c, float s, int64_t n, int threads) {
  pthread_t tid[64];
  Part parts[64];
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  for (int t = 0; t < threads; ++t) {
    parts[t] = (Part){a, b, c, s, n * t / threads, n * (t + 1) / threads};
    pthread_create(&tid[t], 0, run, &parts[t]);
  }
  for (int t = 0; t < threads; ++t) pthread_join(tid[t], 0);
}
