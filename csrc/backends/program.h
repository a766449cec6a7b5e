// The native backend's program: a flat list of aten operator calls over numbered registers, run
// through the c10 dispatcher with no Python per op. Plain libtorch (no CPython), so the Catch2
// tests build programs by hand.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace framejit::native {

// One argument of an operator call, boxed once when the program is built.
struct Operand {
  enum class Kind : uint8_t {
    kRegister,  // the value in `reg`
    kConstant,  // `constant`, boxed at build time
    kList,      // a list built per call from `items` (some are registers): Tensor[], Tensor?[]
  };
  Kind kind = Kind::kConstant;
  int reg = -1;
  c10::IValue constant;
  std::vector<Operand> items;
  c10::TypePtr list_type;  // kList: the schema's list type (its element type types the items)

  static Operand reg_of(int reg);
  static Operand constant_of(c10::IValue value);
  static Operand list_of(c10::TypePtr list_type, std::vector<Operand> items);
};

// A call that is not a registered operator (a generated kernel's launcher): it pops its
// arguments from the stack and pushes its results, like a boxed kernel.
using BoxedCall = std::function<void(torch::jit::Stack&)>;

// One operator call. Its arguments follow the schema's order with defaults filled in.
struct Instruction {
  std::optional<c10::OperatorHandle> op;  // else `call`, printed as `call_name`
  BoxedCall call;
  std::string call_name;
  std::vector<Operand> args;
  // Where each schema return goes (-1: dropped). An op returning one Tensor[] may instead have
  // its elements unpacked into `unpack` (-1: dropped) when only single elements are used.
  std::vector<int> outputs;
  std::vector<int> unpack;
  std::vector<int> frees;  // registers whose last use is this instruction
};

class Program {
 public:
  // Registers 0..num_inputs-1 hold the inputs.
  explicit Program(int num_inputs) : num_inputs_(num_inputs), num_registers_(num_inputs) {}

  int new_register() { return num_registers_++; }
  // Resolves "aten::add" + "Tensor" once; throws c10::Error if no such operator exists.
  static c10::OperatorHandle find_op(const std::string& name, const std::string& overload);

  // Appends a call; `args` may be shorter than the schema (missing trailing arguments take their
  // defaults). Throws c10::Error on an argument count or type the schema rejects.
  void add_call(const c10::OperatorHandle& op, std::vector<Operand> args, std::vector<int> outputs,
                std::vector<int> unpack = {});
  // Appends a call of `call` with `args` as they are, producing outputs.size() results.
  void add_boxed_call(std::string name, BoxedCall call, std::vector<Operand> args,
                      std::vector<int> outputs);
  void set_outputs(std::vector<Operand> outputs) { outputs_ = std::move(outputs); }
  // Computes each register's last use so that intermediates are released as early as eager
  // releases them. Call once, after the last add_call.
  void finish();

  // Runs the program. Grad mode, inference mode and autocast are whatever the caller's thread
  // has: every op goes through the full dispatcher, autograd keys included.
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) const;

  // One aten op per line: "%5 = aten::addmm(%4, %0, %3, beta=1, alpha=1)".
  std::string to_string(const std::string& name = "program") const;

  int num_inputs() const { return num_inputs_; }
  size_t size() const { return instructions_.size(); }

 private:
  void push_operand(const Operand& operand, std::vector<c10::IValue>& registers,
                    torch::jit::Stack& stack) const;

  int num_inputs_;
  int num_registers_;
  std::vector<Instruction> instructions_;
  std::vector<Operand> outputs_;
  std::vector<int> output_frees_;  // unused registers to release before returning
  bool finished_ = false;
};

}  // namespace framejit::native
