"""The code the target's main thread runs to queue a pending call: x86-64 machine code with its assembly beside it.

The helper writes it into a code cave (elf.code_cave: the unused tail of an executable segment's last page, which
nothing ever jumps to) and then changes only the stopped thread's rip (to ENTRY) and orig_rax (to -1, so the
kernel applies no syscall-restart logic to the new rip). From that instant the thread needs nothing from the helper:

  1. below the red zone it copies the cave's data words and saves its flags and general registers, and its whole
     extended state (XSAVE with every feature XCR0 enables; FXSAVE where the OS has not enabled XSAVE);
  2. it maps a page for the source (mmap); at this call's exit the helper, when still there, writes into the page
     PyRun_SimpleString's address and the source, then Py_AddPendingCall's address last;
  3. if that last word is there it calls Py_AddPendingCall(PyRun_SimpleString, source); if not (the helper died
     first) it unmaps the page and queues nothing;
  4. it makes one getpid call, whose entry the helper waits for (rdi holds the result) and where it detaches;
  5. it restores everything and returns to RESUME_RIP with rax = RESUME_RAX: a `ret 128` puts rip and the stack
     pointer back in one instruction (with a shadow stack on, which that ret would not match, a jump through the
     cave's words instead).

resume_point() sets those two as the kernel would have on resuming the thread: where the thread was stopped inside
an interrupted system call that restarts, the syscall instruction again with the call's number (or restart_syscall
for a restart block); otherwise where it stopped, with rax as it was.

A helper killed at any point leaves the thread either untouched (before the rip changes) or running this code,
which finishes on its own. The cave keeps the code afterwards; it is never executed again unless a later injection
points a thread at it, and that injection writes the same bytes.
"""

from __future__ import annotations

import struct

ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK = 512, 513, 514, 516
SYS_RESTART_SYSCALL, SYS_GETPID = 219, 39
ENOSYS = 38

# (machine code in hex, its assembly in GNU as Intel syntax). Data first: the three words the helper fills in.
LISTING: tuple[tuple[str, str], ...] = (
    ("0000000000000000", "resume_rip: .quad 0"),
    ("0000000000000000", "resume_rax: .quad 0"),
    ("0000000000000000", "map_bytes: .quad 0"),
    ("0000000000000000", ".quad 0"),
    ("", "entry:"),
    ("488d642480", "lea rsp, [rsp - 128]"),  # the red zone belongs to the code we stopped
    ("ff35d5ffffff", "push qword ptr [rip + resume_rip]"),  # the data words, copied: a later injection may
    ("ff35d7ffffff", "push qword ptr [rip + resume_rax]"),  # rewrite the cave while this thread is in a call
    ("9c", "pushfq"),
    ("53", "push rbx"),
    ("51", "push rcx"),
    ("52", "push rdx"),
    ("56", "push rsi"),
    ("57", "push rdi"),
    ("55", "push rbp"),
    ("4150", "push r8"),
    ("4151", "push r9"),
    ("4152", "push r10"),
    ("4153", "push r11"),
    ("4154", "push r12"),
    ("4155", "push r13"),
    ("4156", "push r14"),
    ("4157", "push r15"),  # rax is not saved: it leaves as resume_rax
    ("ff35c2ffffff", "push qword ptr [rip + map_bytes]"),
    ("4889e5", "mov rbp, rsp"),
    ("fc", "cld"),  # the ABI wants the direction flag clear at a call
    ("b801000000", "mov eax, 1"),
    ("0fa2", "cpuid"),
    ("0fbae11b", "bt ecx, 27"),  # OSXSAVE
    ("7339", "jnc fx_save"),
    ("b80d000000", "mov eax, 0xd"),
    ("31c9", "xor ecx, ecx"),
    ("0fa2", "cpuid"),  # ebx: the XSAVE area's size for the features XCR0 enables
    ("4829dc", "sub rsp, rbx"),
    ("4883e4c0", "and rsp, -64"),
    ("488dbc2400020000", "lea rdi, [rsp + 512]"),
    ("31c0", "xor eax, eax"),
    ("b908000000", "mov ecx, 8"),
    ("f348ab", "rep stosq"),  # XRSTOR faults on a header whose reserved bytes are not zero
    ("b8ffffffff", "mov eax, -1"),
    ("baffffffff", "mov edx, -1"),
    ("480fae2424", "xsave64 [rsp]"),
    ("41bc01000000", "mov r12d, 1"),
    ("eb13", "jmp saved"),
    ("", "fx_save:"),
    ("4881ec00020000", "sub rsp, 512"),
    ("4883e4c0", "and rsp, -64"),
    ("480fae0424", "fxsave64 [rsp]"),
    ("4531e4", "xor r12d, r12d"),
    ("", "saved:"),  # rsp is 64-byte aligned here, as a call wants it (16)
    ("31ff", "xor edi, edi"),
    ("488b7500", "mov rsi, [rbp]"),  # map_bytes
    ("ba03000000", "mov edx, 3"),  # PROT_READ | PROT_WRITE
    ("41ba22000000", "mov r10d, 0x22"),  # MAP_PRIVATE | MAP_ANONYMOUS
    ("49c7c0ffffffff", "mov r8, -1"),
    ("4531c9", "xor r9d, r9d"),
    ("b809000000", "mov eax, 9"),  # mmap
    ("0f05", "syscall"),  # the helper fills the page at this call's exit
    ("", "mapped:"),
    ("bfffffffff", "mov edi, -1"),
    ("483d01f0ffff", "cmp rax, -4095"),
    ("732c", "jae report"),  # no page
    ("4889c3", "mov rbx, rax"),
    ("488b03", "mov rax, [rbx]"),  # Py_AddPendingCall, the word the helper writes last
    ("4885c0", "test rax, rax"),
    ("740e", "jz unmap"),
    ("488b7b08", "mov rdi, [rbx + 8]"),  # PyRun_SimpleString
    ("488d7310", "lea rsi, [rbx + 16]"),  # the source; the page stays mapped until the interpreter has run it
    ("ffd0", "call rax"),
    ("89c7", "mov edi, eax"),
    ("eb13", "jmp report"),
    ("", "unmap:"),
    ("4889df", "mov rdi, rbx"),
    ("488b7500", "mov rsi, [rbp]"),
    ("b80b000000", "mov eax, 11"),  # munmap
    ("0f05", "syscall"),
    ("bffeffffff", "mov edi, -2"),
    ("", "report:"),
    ("b827000000", "mov eax, 39"),  # getpid: the helper reads rdi at its entry and detaches there
    ("0f05", "syscall"),
    ("", "reported:"),
    ("4585e4", "test r12d, r12d"),
    ("7411", "jz fx_restore"),
    ("b8ffffffff", "mov eax, -1"),
    ("baffffffff", "mov edx, -1"),
    ("480fae2c24", "xrstor64 [rsp]"),
    ("eb05", "jmp restored"),
    ("", "fx_restore:"),
    ("480fae0c24", "fxrstor64 [rsp]"),
    ("", "restored:"),
    ("31c0", "xor eax, eax"),
    ("f3480f1ec8", "rdsspq rax"),  # the shadow stack pointer: 0 unless one is on (a NOP on CPUs without CET)
    ("4889ec", "mov rsp, rbp"),
    ("4883c408", "add rsp, 8"),  # map_bytes; the flags are restored below
    ("4885c0", "test rax, rax"),
    ("751b", "jnz shadow_stack"),
    ("415f", "pop r15"),
    ("415e", "pop r14"),
    ("415d", "pop r13"),
    ("415c", "pop r12"),
    ("415b", "pop r11"),
    ("415a", "pop r10"),
    ("4159", "pop r9"),
    ("4158", "pop r8"),
    ("5d", "pop rbp"),
    ("5f", "pop rdi"),
    ("5e", "pop rsi"),
    ("5a", "pop rdx"),
    ("59", "pop rcx"),
    ("5b", "pop rbx"),
    ("9d", "popfq"),
    ("58", "pop rax"),  # resume_rax
    ("c28000", "ret 128"),  # to resume_rip, and past the red zone: the stack pointer as it was, in one step
    ("", "shadow_stack:"),  # a ret would not match the shadow stack: jump through the cave's words instead
    ("415f", "pop r15"),
    ("415e", "pop r14"),
    ("415d", "pop r13"),
    ("415c", "pop r12"),
    ("415b", "pop r11"),
    ("415a", "pop r10"),
    ("4159", "pop r9"),
    ("4158", "pop r8"),
    ("5d", "pop rbp"),
    ("5f", "pop rdi"),
    ("5e", "pop rsi"),
    ("5a", "pop rdx"),
    ("59", "pop rcx"),
    ("5b", "pop rbx"),
    ("9d", "popfq"),
    ("488da42490000000", "lea rsp, [rsp + 144]"),  # lea and mov leave the restored flags alone
    ("488b058cfeffff", "mov rax, [rip + resume_rax]"),
    ("ff257efeffff", "jmp [rip + resume_rip]"),
)

CODE = bytes.fromhex("".join(h for h, _ in LISTING))


def _offset(label: str) -> int:
    at = 0
    for h, asm in LISTING:
        if asm == f"{label}:":
            return at
        at += len(h) // 2
    raise KeyError(label)


ENTRY = _offset("entry")
MAPPED = _offset("mapped")  # rip at the mmap's entry and exit stops
REPORTED = _offset("reported")  # rip at the getpid's entry stop
SIZE = len(CODE)


def assembly() -> str:
    """The listing as an assembler source (GNU as, Intel syntax)."""
    return ".intel_syntax noprefix\n.text\n" + "".join(f"{asm}\n" for _, asm in LISTING)


def build(resume_rip: int, resume_rax: int, map_bytes: int) -> bytes:
    """The bytes to write at the cave: the code with its three data words filled in."""
    return struct.pack("<QQQ", resume_rip & (2**64 - 1), resume_rax & (2**64 - 1), map_bytes) + CODE[24:]


def signed(value: int) -> int:
    """A 64-bit register's value as a signed integer."""
    return value - (1 << 64) if value >= (1 << 63) else value


def resume_point(rip: int, rax: int, orig_rax: int) -> tuple[int, int]:
    """(rip, rax) to resume a thread stopped with these registers at, as the kernel would with no signal handler."""
    if signed(orig_rax) >= 0:
        err = -signed(rax)
        if err in (ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND):
            return rip - 2, orig_rax
        if err == ERESTART_RESTARTBLOCK:
            return rip - 2, SYS_RESTART_SYSCALL
    return rip, rax
