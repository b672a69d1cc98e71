/* The C half of the sanitizers' self-check (tools/sanitize.sh). */
#include <limits.h>
#include <stdlib.h>

int probe_c_heap_overflow(int n) {
    volatile char *p = malloc(8);
    int v = p[n]; /* n = 8: one past the end */
    free((void *)p);
    return v;
}

int probe_c_signed_overflow(int n) {
    volatile int x = INT_MAX;
    return x + n; /* n = 1 overflows */
}
