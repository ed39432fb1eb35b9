/* The P2P all-reduce protocol of src/comm/comm.cu, for spin.
 *
 * Every rank `me`, for epoch e = 1..NE (one CTA lane; CTAs run the same protocol on disjoint
 * data and share only the per-rank end flag, which the last CTA stores):
 *   1. END: wait until every peer k stored done >= e - NBUF (k finished reading the slots of
 *      epoch e - NBUF, which this epoch reuses)                       [comm.cu step 1]
 *   2. write the partial into every peer's slot (buffer e % NBUF, src me)          [step 2]
 *   3. release flag arrive = e into every peer                                       [step 3]
 *   4. wait for every peer's flag >= e                                               [step 3]
 *   5. read every peer's slot in this rank's buffer (two steps: begin, end)          [step 4]
 *   6. store done = e into every peer                                                [step 5]
 * Every wait may time out (TIMEOUT=1: nondeterministically, whenever it is not yet satisfied;
 * the deadline is arbitrary) or see an abort; a failing rank tells every peer (abort) and
 * stops. STOP=1: a rank may stop calling at any epoch.
 *
 * Checked: no read before write and no overwrite before read (assertions), and no deadlock
 * (no invalid end state: every rank ends, with TIMEOUT=0 by completing every epoch).
 * Parameters (-D): NR ranks, NE epochs, NBUF buffers (2 = the shipped slot = (e & 1) * world +
 * rank), END 1/0 (the end flag), TIMEOUT, STOP.
 */
#ifndef NR
#define NR 2
#endif
#ifndef NE
#define NE 3
#endif
#ifndef NBUF
#define NBUF 2
#endif
#ifndef END
#define END 1
#endif
#ifndef TIMEOUT
#define TIMEOUT 0
#endif
#ifndef STOP
#define STOP 0
#endif

#define SL(o, b, s) (((o) * NBUF + (b)) * NR + (s))

byte arrive[NR * NR];          /* arrive[owner * NR + src]: epoch src's data is in owner's slot */
byte endf[NR * NR];            /* endf[owner * NR + src]: last epoch src finished reading */
byte slot[NR * NBUF * NR];     /* epoch whose data the slot holds (0 = never written) */
byte consumed[NR * NBUF * NR]; /* epoch the slot's owner last finished reading from it */
bool aborted[NR];
byte completed[NR];
bool failed[NR];
bool any_failed = false;
bool any_stopped = false;
byte ended = 0;

inline fail_rank() {
  failed[me] = true;
  any_failed = true;
  k = 0;
  do
  :: k == NR -> break
  :: k < NR -> aborted[k] = true; k++
  od;
  goto finish
}

proctype Rank(byte me) {
  byte e = 1;
  byte k;
  byte b;
  do
  :: e > NE -> break
  :: e <= NE ->
#if STOP
    if
    :: true -> any_stopped = true; goto finish   /* this rank stops calling */
    :: true -> skip
    fi;
#endif
    b = e % NBUF;
#if END
    /* 1. end flags */
    k = 0;
    do
    :: k == NR -> break
    :: k < NR && k == me -> k++
    :: k < NR && k != me && endf[me * NR + k] + NBUF >= e -> k++
    :: k < NR && k != me && aborted[me] -> fail_rank()
#if TIMEOUT
    :: k < NR && k != me && endf[me * NR + k] + NBUF < e -> fail_rank()
#endif
    od;
#endif
    /* 2. push the partial: the slot's previous content must have been read */
    k = 0;
    do
    :: k == NR -> break
    :: k < NR && k == me -> k++
    :: k < NR && k != me ->
      atomic {
        assert(slot[SL(k, b, me)] == 0 || consumed[SL(k, b, me)] == slot[SL(k, b, me)]);
        slot[SL(k, b, me)] = e
      };
      k++
    od;
    /* 3. release flags */
    k = 0;
    do
    :: k == NR -> break
    :: k < NR && k == me -> k++
    :: k < NR && k != me -> arrive[k * NR + me] = e; k++
    od;
    /* 4. wait for every peer's flag */
    k = 0;
    do
    :: k == NR -> break
    :: k < NR && k == me -> k++
    :: k < NR && k != me && arrive[me * NR + k] >= e -> k++
    :: k < NR && k != me && aborted[me] -> fail_rank()
#if TIMEOUT
    :: k < NR && k != me && arrive[me * NR + k] < e -> fail_rank()
#endif
    od;
    /* 5. read: the slot must hold epoch e when the read begins and when it ends */
    k = 0;
    do
    :: k == NR -> break
    :: k < NR && k == me -> k++
    :: k < NR && k != me ->
      assert(slot[SL(me, b, k)] == e);   /* no read before write */
      assert(slot[SL(me, b, k)] == e);   /* not overwritten during the read */
      consumed[SL(me, b, k)] = e;
      k++
    od;
    /* 6. end flags */
    k = 0;
    do
    :: k == NR -> break
    :: k < NR && k == me -> k++
    :: k < NR && k != me -> endf[k * NR + me] = e; k++
    od;
    completed[me] = e;
    e++
  od;
finish:
  ended++
}

init {
  byte i = 0;
  atomic {
    do
    :: i == NR -> break
    :: i < NR -> run Rank(i); i++
    od
  };
  (ended == NR);
  /* nobody failed and nobody stopped => every rank completed every epoch */
  i = 0;
  do
  :: i == NR -> break
  :: i < NR -> assert(any_failed || any_stopped || completed[i] == NE); i++
  od
}
