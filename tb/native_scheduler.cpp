// Native Verilator driver of the scheduler top (fsedp_scheduler): the stimulus side of
// tb/tb_scheduler.py in C++, for regressions of 10^5 rounds.  It does not check anything:
// it writes every transfer it sees to stdout, and fsedp.tb.native replays them into the
// golden model with the scoreboard of the cocotb testbench (fsedp.tb.scoreboard) -- the
// same replay-accepted-completions contract, so every dispatch beat is still compared.
//
// Input: a stimulus file written by fsedp.tb.native.write_stimulus, one round after another:
//     round <items> <reset_offset>          reset_offset < 0: no reset in this round
//     g <hex> | i <hex>                     a gate record / a request init, in stream order
// The last ``g`` item of a round carries ``last``.
//
// Output, one line per event, in the order the Python testbench books them within a cycle:
//     S <cycle> <round>                     the round's last record was taken
//     V <cycle>                             dispatch valid first seen after S or C
//     D <cycle> <hex>                       a dispatch beat was taken
//     C <cycle> <mask>                      a completion mask was taken
//     E <cycle> <round> <deferred> <n_active> <overflow> <bad_record> <spurious_done>
//     X <cycle> <round> <fsm_state>         reset in the middle of the round, in that state
//     Z <cycle>                             end of the stimulus
//
// The datapath stand-in is fsedp.tb.scoreboard.DatapathModel: a dispatched expert completes
// ceil(count * per_token / |T_e|) + uniform(0..max_delay) cycles after its beat; with
// --spurious P a mask names one more random slot with probability P (running or not: the
// scheduler must flag and ignore a slot that is not running); with --gather P the next mask
// waits, with probability P, until every running slot is due (many completions in one beat).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

// Verilator spells the "__" of Amaranth's stream port names (gate__valid) as "___05F".
#include "Vfsedp_scheduler.h"
#include "Vfsedp_scheduler___024root.h"
#include "verilated.h"
#ifdef FSEDP_TRACE
#include "verilated_vcd_c.h"
#endif

// The FSM state register, made readable by the build's Verilator config
// (public_flat_rd), for the coverage of resets in every state.
#define FSM_STATE(top) unsigned((top)->rootp->fsedp_scheduler__DOT__fsm_state)

namespace {

struct Rng {  // splitmix64: small, fast, and the same on every platform
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
    int below(int n) { return n <= 0 ? 0 : int(next() % uint64_t(n)); }
};

// -- ports of any width: Verilator uses an integer up to 64 bits, VlWide<N> above --------
template <typename T> void set_hex(T& port, const char* hex) {
    port = T(strtoull(hex, nullptr, 16));
}
template <std::size_t N> void set_hex(VlWide<N>& port, const char* hex) {
    for (std::size_t w = 0; w < N; ++w) port[w] = 0;
    std::size_t len = strlen(hex);
    for (std::size_t i = 0; i < len; ++i) {  // digit i from the right is bits 4i..4i+3
        char c = hex[len - 1 - i];
        uint32_t d = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
        if (i / 8 < N) port[i / 8] |= d << (4 * (i % 8));
    }
}
template <typename T> uint64_t bits(const T& port, int off, int width) {
    uint64_t v = uint64_t(port) >> off;
    return width >= 64 ? v : v & ((uint64_t(1) << width) - 1);
}
template <std::size_t N> uint64_t bits(const VlWide<N>& port, int off, int width) {
    uint64_t v = 0;
    for (int b = 0; b < width; ++b) {
        int k = off + b;
        v |= uint64_t((port[k / 32] >> (k % 32)) & 1) << b;
    }
    return v;
}
template <typename T> void put_hex(FILE* f, const T& port) {
    fprintf(f, "%llx", (unsigned long long)uint64_t(port));
}
template <std::size_t N> void put_hex(FILE* f, const VlWide<N>& port) {
    int top = int(N) - 1;
    while (top > 0 && port[top] == 0) --top;
    fprintf(f, "%x", port[top]);
    for (int w = top - 1; w >= 0; --w) fprintf(f, "%08x", port[w]);
}

struct Item {
    bool init;
    std::string hex;
};

struct Options {
    const char* stimulus = nullptr;
    uint64_t seed = 1;
    double stall = 0.25;
    int max_delay = 12;
    int per_token = 0;
    double spurious = 0;  // probability that a completion mask names one more slot
    double gather = 0;    // probability that the next mask waits for every running slot
    int chiplets = 4;
    int kind_off = 0, count_off = 0, count_w = 0, traj_off = 0, entry_off = 0, entry_w = 0;
    long trace_round = -1;  // record this round in a VCD, then stop
    const char* trace_file = "dump.vcd";
};

class Bench {
  public:
    explicit Bench(const Options& o) : o_(o), top_(new Vfsedp_scheduler), due_(o.chiplets, -1) {
        rng_.s = o.seed;
    }
    ~Bench() {
#ifdef FSEDP_TRACE
        if (vcd_) vcd_->close();
#endif
        top_->final();
    }

    void tick() {
        top_->clk = 1;
        top_->eval();
        dump(2 * now_ + 1);
        top_->clk = 0;
        top_->eval();
        ++now_;
        dump(2 * now_);
    }

    void reset(int cycles) {
        top_->rst = 1;
        for (int i = 0; i < cycles; ++i) tick();
        top_->rst = 0;
    }

    void wait_idle() {  // after reset the EIT clears itself (E cycles), then idle rises
        top_->gate___05Fvalid = top_->req_init___05Fvalid = top_->done___05Fvalid = 0;
        for (;;) {
            top_->eval();
            bool ok = top_->idle;
            tick();
            if (ok) return;
        }
    }

    // one round, up to its end (idle after the last record) or its mid-round reset
    void round(long index, const std::vector<Item>& items, long reset_offset) {
        std::size_t qi = 0;
        bool sent_last = false, want_valid = false;
        uint64_t done_mask = 0;
        long start = now_;
        std::size_t last_rec = items.size();
        for (std::size_t i = 0; i < items.size(); ++i)
            if (!items[i].init) last_rec = i;
        for (auto& d : due_) d = -1;
        for (;;) {
            // -- drive (just after the clock edge) -------------------------------------
            int gv = 0, rv = 0;
            if (qi < items.size() && rng_.uniform() >= o_.stall) {
                if (items[qi].init) {
                    rv = 1;
                    set_hex(top_->req_init___05Fpayload, items[qi].hex.c_str());
                } else {
                    gv = 1;
                    set_hex(top_->gate___05Fpayload, items[qi].hex.c_str());
                }
            }
            top_->gate___05Fvalid = gv;
            top_->req_init___05Fvalid = rv;
            int ready = rng_.uniform() >= o_.stall;
            top_->dispatch___05Fready = ready;
            if (sent_last && !done_mask) {
                uint64_t running = 0;
                for (int s = 0; s < o_.chiplets; ++s) {
                    if (due_[s] >= 0 && due_[s] <= now_) done_mask |= uint64_t(1) << s;
                    if (due_[s] >= 0) running |= uint64_t(1) << s;
                }
                if (gather_ && done_mask != running) done_mask = 0;  // wait for all of them
                if (done_mask && o_.spurious > 0 && rng_.uniform() < o_.spurious)
                    done_mask |= uint64_t(1) << rng_.below(o_.chiplets);  // maybe not running
            }
            top_->done___05Fvalid = done_mask != 0;
            top_->done___05Fpayload = done_mask;
            if (reset_offset >= 0 && now_ >= start + reset_offset) {
                top_->eval();
                unsigned state = FSM_STATE(top_);  // the state the reset interrupts
                reset(2);
                printf("X %ld %ld %u\n", now_, index, state);
                wait_idle();
                return;
            }
            // -- sample (settled values of this cycle) -----------------------------------
            top_->eval();
            bool idle = top_->idle;
            if (sent_last && idle) {
                printf("E %ld %ld ", now_, index);
                put_hex(stdout, top_->deferred);
                printf(" %u %u %u %u\n", unsigned(top_->n_active), unsigned(top_->overflow),
                       unsigned(top_->bad_record), unsigned(top_->spurious_done));
            }
            bool dv = top_->dispatch___05Fvalid;
            if (dv && want_valid) {
                printf("V %ld\n", now_);
                want_valid = false;
            }
            bool got = ready && dv;
            uint64_t kind = 0, entry = 0, count = 0, traj = 0;
            if (got) {
                kind = bits(top_->dispatch___05Fpayload, o_.kind_off, 1);
                entry = bits(top_->dispatch___05Fpayload, o_.entry_off, o_.entry_w);
                count = bits(top_->dispatch___05Fpayload, o_.count_off, o_.count_w);
                traj = bits(top_->dispatch___05Fpayload, o_.traj_off, o_.chiplets);
            }
            bool done_taken = done_mask && top_->done___05Fready;
            bool gate_taken = (gv && top_->gate___05Fready) || (rv && top_->req_init___05Fready);
            auto beat = top_->dispatch___05Fpayload;  // as sampled, before the edge
            tick();
            if (sent_last && idle) return;
            // -- bookkeeping of the transfers at this edge ----------------------------------
            if (gate_taken) {
                if (qi == last_rec) {
                    sent_last = want_valid = true;
                    printf("S %ld %ld\n", now_, index);
                }
                ++qi;
            }
            if (got) {
                printf("D %ld ", now_);
                put_hex(stdout, beat);
                putchar('\n');
                if (kind == 0 && entry < uint64_t(o_.chiplets)) {
                    long work = 0;
                    if (o_.per_token) {
                        int n = __builtin_popcountll(traj);
                        n = n ? n : 1;
                        work = long((count * o_.per_token + n - 1) / n);
                    }
                    due_[entry] = now_ + work + rng_.below(o_.max_delay + 1);
                }
            }
            if (done_taken) {
                printf("C %ld %llx\n", now_, (unsigned long long)done_mask);
                for (int s = 0; s < o_.chiplets; ++s)
                    if (done_mask >> s & 1) due_[s] = -1;
                done_mask = 0;
                want_valid = true;
                gather_ = o_.gather > 0 && rng_.uniform() < o_.gather;
            }
        }
    }

    void start_trace() {
#ifdef FSEDP_TRACE
        Verilated::traceEverOn(true);
        vcd_ = std::make_unique<VerilatedVcdC>();
        top_->trace(vcd_.get(), 99);
        vcd_->open(o_.trace_file);
        dump(2 * now_);
#else
        fprintf(stderr, "native_scheduler: built without tracing (FSEDP_TRACE)\n");
        exit(2);
#endif
    }

    long now() const { return now_; }

  private:
    void dump(long t) {
#ifdef FSEDP_TRACE
        if (vcd_) vcd_->dump(uint64_t(t) * 5);
#else
        (void)t;
#endif
    }

    Options o_;
    std::unique_ptr<Vfsedp_scheduler> top_;
    Rng rng_{};
    std::vector<long> due_;
    long now_ = 0;
    bool gather_ = false;
#ifdef FSEDP_TRACE
    std::unique_ptr<VerilatedVcdC> vcd_;
#endif
};

}  // namespace

int main(int argc, char** argv) {
    Verilated::commandArgs(argc, argv);
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i];
        const char* v = argv[i + 1];
        if (k == "--stimulus") o.stimulus = v;
        else if (k == "--seed") o.seed = strtoull(v, nullptr, 10);
        else if (k == "--stall") o.stall = atof(v);
        else if (k == "--max-delay") o.max_delay = atoi(v);
        else if (k == "--per-token") o.per_token = atoi(v);
        else if (k == "--spurious") o.spurious = atof(v);
        else if (k == "--gather") o.gather = atof(v);
        else if (k == "--chiplets") o.chiplets = atoi(v);
        else if (k == "--kind-off") o.kind_off = atoi(v);
        else if (k == "--count") sscanf(v, "%d:%d", &o.count_off, &o.count_w);
        else if (k == "--traj-off") o.traj_off = atoi(v);
        else if (k == "--entry") sscanf(v, "%d:%d", &o.entry_off, &o.entry_w);
        else if (k == "--trace-round") o.trace_round = atol(v);
        else if (k == "--trace-file") o.trace_file = v;
        else if (k[0] == '+') continue;  // Verilator's own +verilator+... arguments
        else {
            fprintf(stderr, "native_scheduler: unknown argument %s\n", k.c_str());
            return 2;
        }
    }
    if (!o.stimulus) {
        fprintf(stderr, "native_scheduler: --stimulus FILE is required\n");
        return 2;
    }
    FILE* in = fopen(o.stimulus, "r");
    if (!in) {
        fprintf(stderr, "native_scheduler: cannot read %s\n", o.stimulus);
        return 2;
    }
    setvbuf(stdout, nullptr, _IOFBF, 1 << 16);
    Bench bench(o);
    bench.reset(2);
    bench.wait_idle();
    std::vector<Item> items;
    char kind[8], hex[512];
    long n_items, reset_offset;
    for (long index = 0; fscanf(in, "%7s %ld %ld", kind, &n_items, &reset_offset) == 3; ++index) {
        items.clear();
        for (long i = 0; i < n_items; ++i) {
            if (fscanf(in, "%7s %511s", kind, hex) != 2) {
                fprintf(stderr, "native_scheduler: %s: round %ld truncated\n", o.stimulus, index);
                return 2;
            }
            items.push_back({kind[0] == 'i', hex});
        }
        if (index == o.trace_round) bench.start_trace();
        bench.round(index, items, reset_offset);
        if (index == o.trace_round) break;
        if (index % 256 == 255) fflush(stdout);  // the checker keeps pace
    }
    printf("Z %ld\n", bench.now());
    fflush(stdout);
    fclose(in);
    return 0;
}
