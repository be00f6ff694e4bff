/* Heap sampler for tools/soak.py --heap (LD_PRELOAD): once a second, the
   process's glibc heap as mallinfo2() reports it, to tell a leak (bytes in
   use grow) from allocator high-water marks (the heap's size grows while
   the bytes in use do not). Writes "time rss_kb heap_bytes in_use_bytes"
   lines to $MLTORCH_HEAP_PROBE/heap.<pid>; does nothing without that
   variable. glibc >= 2.33. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void *sample(void *dir)
{
  char name[4096];
  snprintf(name, sizeof name, "%s/heap.%d", (const char *) dir, (int) getpid());
  FILE *out = fopen(name, "w");
  if (!out) return NULL;
  for (;;) {
    sleep(1);
    struct mallinfo2 m = mallinfo2();
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long pages = 0, resident = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    if (statm) {
      if (fscanf(statm, "%ld %ld", &pages, &resident) != 2) resident = 0;
      fclose(statm);
    }
    fprintf(out, "%.3f %ld %zu %zu\n", t.tv_sec + 1e-9 * t.tv_nsec, resident * (sysconf(_SC_PAGESIZE) / 1024),
            m.arena + m.hblkhd, m.uordblks + m.hblkhd);
    fflush(out);
  }
  return NULL;
}

__attribute__((constructor)) static void start(void)
{
  const char *dir = getenv("MLTORCH_HEAP_PROBE");
  if (!dir) return;
  pthread_t thread;
  if (pthread_create(&thread, NULL, sample, (void *) dir) == 0) pthread_detach(thread);
}
