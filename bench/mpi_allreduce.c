/* The OpenMPI anchor of ddprun-bench allreduce, built by the bench with mpicc when it is present:
 * MPI_Allreduce(MPI_IN_PLACE, float32, MPI_SUM), sizes MIN..MAX bytes in steps of x4, each timed
 * like ddprun's (every iteration after a barrier; the median on rank 0), iterations from a probe
 * within SECONDS per size (5..300, rank 0 decides). Prints "MPI <bytes> <median us>" per size.
 * usage: mpi_allreduce MIN MAX SECONDS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc != 4) {
    fprintf(stderr, "usage: mpi_allreduce MIN_BYTES MAX_BYTES SECONDS\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const size_t minBytes = strtoull(argv[1], NULL, 10), maxBytes = strtoull(argv[2], NULL, 10);
  const double seconds = atof(argv[3]);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (size_t bytes = minBytes; bytes <= maxBytes; bytes *= 4) {
    const int n = (int)(bytes / 4);
    float* buf = malloc(bytes);
    for (int i = 0; i < n; ++i) buf[i] = 1.0f;
    MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double probe = (MPI_Wtime() - t0) * 1e6;
    long iters = (long)(seconds * 1e6 / (probe > 1 ? probe : 1));
    if (iters < 5) iters = 5;
    if (iters > 300) iters = 300;
    MPI_Bcast(&iters, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    double* us = malloc(sizeof(double) * iters);
    for (long i = 0; i < iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      us[i] = (MPI_Wtime() - t0) * 1e6;
    }
    qsort(us, iters, sizeof(double), cmp);
    if (rank == 0) printf("MPI %zu %.2f\n", bytes, us[iters / 2]);
    fflush(stdout);
    free(us);
    free(buf);
  }
  MPI_Finalize();
  return 0;
}
