/* NCCL, loaded at run time (dlopen), so that no NCCL or CUDA header or library is needed to
 * build, and the same binary starts where neither exists.
 *
 * The ABI is declared here from nccl.h 2.28 (stable since 2.14 for what we
 * use): results, data types, reduction ops, the 128-byte unique id and
 * ncclConfig_t, whose size/magic/version handshake lets a newer or older
 * library read only the fields it knows. */
#ifndef UVCCL_NCCL_NCCL_API_H
#define UVCCL_NCCL_NCCL_API_H

#include <stddef.h>

/* ncclResult_t */
#define UVCCL__NCCL_SUCCESS 0
#define UVCCL__NCCL_UNHANDLED_CUDA_ERROR 1
#define UVCCL__NCCL_SYSTEM_ERROR 2
#define UVCCL__NCCL_INTERNAL_ERROR 3
#define UVCCL__NCCL_INVALID_ARGUMENT 4
#define UVCCL__NCCL_INVALID_USAGE 5
#define UVCCL__NCCL_REMOTE_ERROR 6
#define UVCCL__NCCL_IN_PROGRESS 7

/* ncclDataType_t */
#define UVCCL__NCCL_INT8 0
#define UVCCL__NCCL_UINT8 1
#define UVCCL__NCCL_INT32 2
#define UVCCL__NCCL_UINT32 3
#define UVCCL__NCCL_INT64 4
#define UVCCL__NCCL_UINT64 5
#define UVCCL__NCCL_FLOAT16 6
#define UVCCL__NCCL_FLOAT32 7
#define UVCCL__NCCL_FLOAT64 8
#define UVCCL__NCCL_BFLOAT16 9

/* ncclRedOp_t (PreMulSum ops are made at run time) */
#define UVCCL__NCCL_SUM 0
#define UVCCL__NCCL_PROD 1
#define UVCCL__NCCL_MAX 2
#define UVCCL__NCCL_MIN 3
#define UVCCL__NCCL_AVG 4

#define UVCCL__NCCL_SPLIT_NOCOLOR (-1)
#define UVCCL__NCCL_SHRINK_ABORT 0x01 /* NCCL_SHRINK_ABORT */
#define UVCCL__NCCL_SCALAR_HOST_IMMEDIATE 1

typedef void *uvccl__nccl_comm_t;
typedef struct {
  char internal[128];
} uvccl__nccl_unique_id_t;

/* ncclConfig_v22800, field for field. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} uvccl__nccl_config_t;

/* As NCCL_CONFIG_INITIALIZER, with blocking = 0 (every NCCL call returns
 * at once; ncclCommGetAsyncError says when it finished). */
void uvccl__nccl_config_init(uvccl__nccl_config_t *cfg);

typedef struct {
  int (*GetVersion)(int *version);
  int (*GetUniqueId)(uvccl__nccl_unique_id_t *id);
  int (*CommInitRankConfig)(uvccl__nccl_comm_t *comm, int nranks,
                            uvccl__nccl_unique_id_t id, int rank,
                            uvccl__nccl_config_t *config);
  int (*CommGetAsyncError)(uvccl__nccl_comm_t comm, int *async_error);
  int (*CommFinalize)(uvccl__nccl_comm_t comm);
  int (*CommDestroy)(uvccl__nccl_comm_t comm);
  int (*CommAbort)(uvccl__nccl_comm_t comm);
  int (*CommSplit)(uvccl__nccl_comm_t comm, int color, int key,
                   uvccl__nccl_comm_t *newcomm, uvccl__nccl_config_t *config);
  int (*CommCount)(const uvccl__nccl_comm_t comm, int *count);
  int (*CommUserRank)(const uvccl__nccl_comm_t comm, int *rank);
  const char *(*GetErrorString)(int result);
  const char *(*GetLastError)(uvccl__nccl_comm_t comm);
  int (*GroupStart)(void);
  int (*GroupEnd)(void);
  int (*AllReduce)(const void *sendbuff, void *recvbuff, size_t count,
                   int datatype, int op, uvccl__nccl_comm_t comm,
                   void *stream);
  int (*Broadcast)(const void *sendbuff, void *recvbuff, size_t count,
                   int datatype, int root, uvccl__nccl_comm_t comm,
                   void *stream);
  int (*Reduce)(const void *sendbuff, void *recvbuff, size_t count,
                int datatype, int op, int root, uvccl__nccl_comm_t comm,
                void *stream);
  int (*AllGather)(const void *sendbuff, void *recvbuff, size_t sendcount,
                   int datatype, uvccl__nccl_comm_t comm, void *stream);
  int (*ReduceScatter)(const void *sendbuff, void *recvbuff,
                       size_t recvcount, int datatype, int op,
                       uvccl__nccl_comm_t comm, void *stream);
  int (*Send)(const void *sendbuff, size_t count, int datatype, int peer,
              uvccl__nccl_comm_t comm, void *stream);
  int (*Recv)(void *recvbuff, size_t count, int datatype, int peer,
              uvccl__nccl_comm_t comm, void *stream);
  int (*RedOpCreatePreMulSum)(int *op, void *scalar, int datatype,
                              int residence, uvccl__nccl_comm_t comm);
  int (*RedOpDestroy)(int op, uvccl__nccl_comm_t comm);
  /* Optional (NULL where the loaded NCCL is older): ncclCommRevoke
   * (2.28), ncclCommShrink (2.27), ncclCommGetUniqueId and ncclCommGrow
   * (2.29). */
  int (*CommRevoke)(uvccl__nccl_comm_t comm, int flags);
  int (*CommShrink)(uvccl__nccl_comm_t comm, int *exclude, int nexclude,
                    uvccl__nccl_comm_t *newcomm, uvccl__nccl_config_t *config,
                    int flags);
  int (*CommGetUniqueId)(uvccl__nccl_comm_t comm, uvccl__nccl_unique_id_t *id);
  int (*CommGrow)(uvccl__nccl_comm_t comm, int nranks,
                  const uvccl__nccl_unique_id_t *id, int rank,
                  uvccl__nccl_comm_t *newcomm, uvccl__nccl_config_t *config);
  int version; /* ncclGetVersion: 22809 for 2.28.9 */
} uvccl__nccl_api_t;

extern uvccl__nccl_api_t uvccl__nccl;

/* Loads libnccl once per process (thread-safe); the CUDA runtime is
 * cuda_api.h's (uvccl__gpu_load). 0, or UVCCL_ENOGPU
 * with the reason in err ("libnccl.so.2: cannot open shared object
 * file", "libnccl.so.2: no symbol ncclCommSplit (NCCL too old?)"). */
int uvccl__nccl_api_load(char *err, size_t errlen);

/* "ncclInvalidUsage: <ncclGetLastError text>" for messages. */
void uvccl__nccl_describe(int result, uvccl__nccl_comm_t comm, char *buf,
                          size_t len);

#endif
