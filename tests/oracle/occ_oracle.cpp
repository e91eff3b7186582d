// Test oracle for jaxsched.occupancy: NVIDIA's own occupancy calculator, cuda_occupancy.h.
//
// The header is plain host C++ (no CUDA runtime, no GPU needed); build with
//   g++ -O2 -std=c++17 -I<cuda>/include occ_oracle.cpp -o occ_oracle
//
// Input is read from stdin as whitespace-separated integers (newlines are just whitespace).
//
// Default mode: rows of ROW_FIELDS (24) integers, one launch each, in this order:
//   device (cudaOccDeviceProp):    computeMajor computeMinor maxThreadsPerBlock
//                                  maxThreadsPerMultiprocessor regsPerBlock regsPerMultiprocessor
//                                  warpSize sharedMemPerBlock sharedMemPerMultiprocessor numSms
//                                  sharedMemPerBlockOptin reservedSharedMemPerBlock
//   function (cudaOccFuncAttributes): maxThreadsPerBlock numRegs sharedSizeBytes
//                                  partitionedGCConfig shmemLimitConfig maxDynamicSharedSizeBytes
//                                  numBlockBarriers virtualResourceCount
//   state (cudaOccDeviceState):    cacheConfig carveoutConfig
//   launch:                        blockSize dynamicSmemSize
// For each row it prints one line of RESULT_FIELDS (10) integers:
//   activeBlocksPerMultiprocessor blockLimitWarps blockLimitRegs blockLimitSharedMem
//   blockLimitBlocks blockLimitBarriers limitingFactors status
//   allocatedRegistersPerBlock allocatedSharedMemPerBlock
// where status is the cudaOccError code (0 = CUDA_OCC_SUCCESS); when it is not 0 every other
// field is printed as -1.
//
// "rules" mode (first token "rules"): then pairs "major minor"; for each it prints the header's
// per-CC rules, one line:
//   major minor maxBlocksPerSM smemAllocGranularity regAllocGranularity subPartitions
//   regMaxPerThread barriersAvailablePerSM nCarveouts carveoutKiB...
// (-1 for a rule the header does not know for that CC). barriersAvailablePerSM is what
// cudaOccMaxBlocksPerSMBlockBarrierLimit gives one barrier per block; the carveout sizes are the
// distinct results of cudaOccAlignUpShmemSizeVoltaPlus over 0..256 KiB, in KiB, ascending.

#include <cuda_occupancy.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr int ROW_FIELDS = 24;

std::string read_stdin() {
    std::string data;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) data.append(buf, n);
    return data;
}

// Splits the input into tokens; returns false (after a message) on a malformed integer.
bool parse_ints(const char* p, const char* end, std::vector<long long>* out) {
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) ++p;
        if (p >= end) break;
        long long v = 0;
        auto [next, ec] = std::from_chars(p, end, v);
        if (ec != std::errc() || (next < end && !(*next == ' ' || *next == '\n' || *next == '\t' || *next == '\r'))) {
            const char* stop = p;
            while (stop < end && !(*stop == ' ' || *stop == '\n' || *stop == '\t' || *stop == '\r')) ++stop;
            fprintf(stderr, "occ_oracle: not an integer: '%.*s' (token %zu)\n", int(stop - p), p, out->size());
            return false;
        }
        out->push_back(v);
        p = next;
    }
    return true;
}

struct Writer {
    std::string buf;
    void put(long long v, char sep) {
        char tmp[24];
        auto [end, ec] = std::to_chars(tmp, tmp + sizeof tmp, v);
        (void)ec;
        buf.append(tmp, end);
        buf.push_back(sep);
        if (buf.size() > (1 << 20)) flush();
    }
    void flush() {
        fwrite(buf.data(), 1, buf.size(), stdout);
        buf.clear();
    }
};

int run_occupancy(const std::vector<long long>& v, Writer* w) {
    if (v.size() % ROW_FIELDS != 0) {
        fprintf(stderr, "occ_oracle: %zu integers is not a whole number of %d-field rows\n", v.size(), ROW_FIELDS);
        return 2;
    }
    for (size_t i = 0; i < v.size(); i += ROW_FIELDS) {
        const long long* r = &v[i];
        cudaOccDeviceProp prop;
        prop.computeMajor = int(r[0]);
        prop.computeMinor = int(r[1]);
        prop.maxThreadsPerBlock = int(r[2]);
        prop.maxThreadsPerMultiprocessor = int(r[3]);
        prop.regsPerBlock = int(r[4]);
        prop.regsPerMultiprocessor = int(r[5]);
        prop.warpSize = int(r[6]);
        prop.sharedMemPerBlock = size_t(r[7]);
        prop.sharedMemPerMultiprocessor = size_t(r[8]);
        prop.numSms = int(r[9]);
        prop.sharedMemPerBlockOptin = size_t(r[10]);
        prop.reservedSharedMemPerBlock = size_t(r[11]);

        cudaOccFuncAttributes attr;
        attr.maxThreadsPerBlock = int(r[12]);
        attr.numRegs = int(r[13]);
        attr.sharedSizeBytes = size_t(r[14]);
        attr.partitionedGCConfig = cudaOccPartitionedGCConfig(r[15]);
        attr.shmemLimitConfig = cudaOccFuncShmemConfig(r[16]);
        attr.maxDynamicSharedSizeBytes = size_t(r[17]);
        attr.numBlockBarriers = int(r[18]);
        attr.virtualResourceCount = int(r[19]);

        cudaOccDeviceState state;
        state.cacheConfig = cudaOccCacheConfig(r[20]);
        state.carveoutConfig = int(r[21]);

        const int block_size = int(r[22]);
        const size_t dynamic_smem = size_t(r[23]);

        cudaOccResult res;
        memset(&res, 0, sizeof res);
        cudaOccError status = cudaOccMaxActiveBlocksPerMultiprocessor(&res, &prop, &attr, &state, block_size, dynamic_smem);
        if (status == CUDA_OCC_SUCCESS) {
            w->put(res.activeBlocksPerMultiprocessor, ' ');
            w->put(res.blockLimitWarps, ' ');
            w->put(res.blockLimitRegs, ' ');
            w->put(res.blockLimitSharedMem, ' ');
            w->put(res.blockLimitBlocks, ' ');
            w->put(res.blockLimitBarriers, ' ');
            w->put(res.limitingFactors, ' ');
            w->put(0, ' ');
            w->put(res.allocatedRegistersPerBlock, ' ');
            w->put((long long)res.allocatedSharedMemPerBlock, '\n');
        } else {
            for (int k = 0; k < 7; ++k) w->put(-1, ' ');
            w->put(int(status), ' ');
            w->put(-1, ' ');
            w->put(-1, '\n');
        }
    }
    return 0;
}

int run_rules(const std::vector<long long>& v, Writer* w) {
    if (v.size() % 2 != 0) {
        fprintf(stderr, "occ_oracle: rules mode wants pairs 'major minor'\n");
        return 2;
    }
    for (size_t i = 0; i < v.size(); i += 2) {
        cudaOccDeviceProp prop;
        prop.computeMajor = int(v[i]);
        prop.computeMinor = int(v[i + 1]);
        int max_blocks = -1, smem_gran = -1, reg_gran = -1, subparts = -1, reg_max = -1, bars = -1;
        if (cudaOccMaxBlocksPerMultiprocessor(&max_blocks, &prop) != CUDA_OCC_SUCCESS) max_blocks = -1;
        if (cudaOccSMemAllocationGranularity(&smem_gran, &prop) != CUDA_OCC_SUCCESS) smem_gran = -1;
        if (cudaOccRegAllocationGranularity(&reg_gran, &prop) != CUDA_OCC_SUCCESS) reg_gran = -1;
        if (cudaOccSubPartitionsPerMultiprocessor(&subparts, &prop) != CUDA_OCC_SUCCESS) subparts = -1;
        if (cudaOccRegAllocationMaxPerThread(&reg_max, &prop) != CUDA_OCC_SUCCESS) reg_max = -1;
        if (max_blocks > 0) {
            cudaOccFuncAttributes attr;
            attr.numBlockBarriers = 1;
            if (cudaOccMaxBlocksPerSMBlockBarrierLimit(&bars, max_blocks, &prop, &attr) != CUDA_OCC_SUCCESS) bars = -1;
        }
        std::set<long long> carveouts;
        for (size_t kib = 0; kib <= 256; ++kib) {
            size_t size = kib * 1024;
            if (cudaOccAlignUpShmemSizeVoltaPlus(&size, &prop) == CUDA_OCC_SUCCESS) carveouts.insert((long long)(size / 1024));
        }
        w->put(prop.computeMajor, ' ');
        w->put(prop.computeMinor, ' ');
        w->put(max_blocks, ' ');
        w->put(smem_gran, ' ');
        w->put(reg_gran, ' ');
        w->put(subparts, ' ');
        w->put(reg_max, ' ');
        w->put(bars, ' ');
        w->put((long long)carveouts.size(), carveouts.empty() ? '\n' : ' ');
        size_t k = 0;
        for (long long c : carveouts) w->put(c, ++k == carveouts.size() ? '\n' : ' ');
    }
    return 0;
}

}  // namespace

int main() {
    std::string data = read_stdin();
    const char* p = data.data();
    const char* end = p + data.size();
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) ++p;
    bool rules = (end - p >= 5 && strncmp(p, "rules", 5) == 0);
    if (rules) p += 5;
    std::vector<long long> values;
    values.reserve(data.size() / 3);
    if (!parse_ints(p, end, &values)) return 2;
    Writer w;
    int rc = rules ? run_rules(values, &w) : run_occupancy(values, &w);
    w.flush();
    return rc;
}
