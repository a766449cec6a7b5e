// The native program's builder, interpreter and printer.
#include "backends/program.h"

#include <c10/util/Exception.h>

#include <charconv>
#include <string>

namespace framejit::native {

Operand Operand::reg_of(int reg) {
  Operand operand;
  operand.kind = Kind::kRegister;
  operand.reg = reg;
  return operand;
}

Operand Operand::constant_of(c10::IValue value) {
  Operand operand;
  operand.kind = Kind::kConstant;
  operand.constant = std::move(value);
  return operand;
}

Operand Operand::list_of(c10::TypePtr list_type, std::vector<Operand> items) {
  TORCH_CHECK(list_type && list_type->kind() == c10::TypeKind::ListType,
              "framejit native: a list operand needs a list type");
  Operand operand;
  operand.kind = Kind::kList;
  operand.list_type = std::move(list_type);
  operand.items = std::move(items);
  return operand;
}

c10::OperatorHandle Program::find_op(const std::string& name, const std::string& overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
}

void Program::add_call(const c10::OperatorHandle& op, std::vector<Operand> args,
                       std::vector<int> outputs, std::vector<int> unpack) {
  TORCH_CHECK(!finished_, "framejit native: add_call after finish");
  const c10::FunctionSchema& schema = op.schema();
  const auto& params = schema.arguments();
  TORCH_CHECK(args.size() <= params.size(), "framejit native: ", schema.name(), " takes ",
              params.size(), " arguments, got ", args.size());
  for (size_t i = args.size(); i < params.size(); ++i) {
    TORCH_CHECK(params[i].default_value().has_value(), "framejit native: ", schema.name(),
                " needs argument '", params[i].name(), "'");
    args.push_back(Operand::constant_of(*params[i].default_value()));
  }
  TORCH_CHECK(outputs.size() == schema.returns().size(), "framejit native: ", schema.name(),
              " returns ", schema.returns().size(), " values, ", outputs.size(), " targets given");
  if (!unpack.empty()) {
    TORCH_CHECK(schema.returns().size() == 1 &&
                    schema.returns()[0].type()->kind() == c10::TypeKind::ListType,
                "framejit native: only an op returning one list can be unpacked");
  }
  Instruction instr;
  instr.op = op;
  instr.args = std::move(args);
  instr.outputs = std::move(outputs);
  instr.unpack = std::move(unpack);
  instructions_.push_back(std::move(instr));
}

void Program::add_boxed_call(std::string name, BoxedCall call, std::vector<Operand> args,
                             std::vector<int> outputs) {
  TORCH_CHECK(!finished_, "framejit native: add_boxed_call after finish");
  TORCH_CHECK(call, "framejit native: empty call for ", name);
  Instruction instr;
  instr.call = std::move(call);
  instr.call_name = std::move(name);
  instr.args = std::move(args);
  instr.outputs = std::move(outputs);
  instructions_.push_back(std::move(instr));
}

namespace {

void for_each_register(const Operand& operand, const std::function<void(int)>& fn) {
  if (operand.kind == Operand::Kind::kRegister) fn(operand.reg);
  for (const Operand& item : operand.items) for_each_register(item, fn);
}

}  // namespace

void Program::finish() {
  TORCH_CHECK(!finished_, "framejit native: finish called twice");
  finished_ = true;
  constexpr int kNever = -1;
  constexpr int kOutput = 1 << 30;  // used by the program's outputs: never released early
  std::vector<int> last_use(num_registers_, kNever);
  std::vector<int> defined_at(num_registers_, kNever);
  for (size_t i = 0; i < instructions_.size(); ++i) {
    for (const Operand& arg : instructions_[i].args) {
      for_each_register(arg, [&](int reg) { last_use[reg] = static_cast<int>(i); });
    }
    for (int reg : instructions_[i].outputs) if (reg >= 0) defined_at[reg] = static_cast<int>(i);
    for (int reg : instructions_[i].unpack) if (reg >= 0) defined_at[reg] = static_cast<int>(i);
  }
  for (const Operand& out : outputs_) for_each_register(out, [&](int reg) { last_use[reg] = kOutput; });
  for (int reg = 0; reg < num_registers_; ++reg) {
    if (last_use[reg] == kOutput) continue;
    if (last_use[reg] != kNever) {
      instructions_[last_use[reg]].frees.push_back(reg);
    } else if (defined_at[reg] != kNever) {
      instructions_[defined_at[reg]].frees.push_back(reg);  // a result nobody reads
    } else if (reg < num_inputs_) {
      output_frees_.push_back(reg);  // an input the program never reads
    }
  }
}

void Program::push_operand(const Operand& operand, std::vector<c10::IValue>& registers,
                           torch::jit::Stack& stack) const {
  switch (operand.kind) {
    case Operand::Kind::kRegister:
      stack.push_back(registers[operand.reg]);
      return;
    case Operand::Kind::kConstant:
      stack.push_back(operand.constant);
      return;
    case Operand::Kind::kList: {
      const c10::TypePtr& elem = operand.list_type->containedType(0);
      c10::impl::GenericList list(elem);
      list.reserve(operand.items.size());
      torch::jit::Stack item_stack;
      for (const Operand& item : operand.items) {
        push_operand(item, registers, item_stack);
        list.push_back(std::move(item_stack.back()));
        item_stack.pop_back();
      }
      stack.emplace_back(std::move(list));
      return;
    }
  }
}

std::vector<c10::IValue> Program::run(std::vector<c10::IValue> inputs) const {
  TORCH_CHECK(finished_, "framejit native: run before finish");
  TORCH_CHECK(static_cast<int>(inputs.size()) == num_inputs_, "framejit native: expected ",
              num_inputs_, " inputs, got ", inputs.size());
  std::vector<c10::IValue> registers(num_registers_);
  for (int i = 0; i < num_inputs_; ++i) registers[i] = std::move(inputs[i]);
  torch::jit::Stack stack;
  for (const Instruction& instr : instructions_) {
    stack.clear();
    stack.reserve(instr.args.size());
    for (const Operand& arg : instr.args) push_operand(arg, registers, stack);
    if (instr.op) {
      instr.op->callBoxed(stack);
    } else {
      instr.call(stack);
      TORCH_CHECK(stack.size() == instr.outputs.size(), "framejit native: ", instr.call_name,
                  " returned ", stack.size(), " values, expected ", instr.outputs.size());
    }
    if (!instr.unpack.empty()) {
      c10::List<c10::IValue> list = stack[0].toList();
      for (size_t i = 0; i < instr.unpack.size() && i < list.size(); ++i) {
        if (instr.unpack[i] >= 0) registers[instr.unpack[i]] = list.get(i);
      }
    }
    for (size_t i = 0; i < instr.outputs.size(); ++i) {
      if (instr.outputs[i] >= 0) registers[instr.outputs[i]] = std::move(stack[i]);
    }
    for (int reg : instr.frees) registers[reg] = c10::IValue();
  }
  std::vector<c10::IValue> results;
  results.reserve(outputs_.size());
  torch::jit::Stack out_stack;
  for (const Operand& out : outputs_) {
    push_operand(out, registers, out_stack);
    results.push_back(std::move(out_stack.back()));
    out_stack.pop_back();
  }
  return results;
}

namespace {

std::string register_name(int reg) { return reg >= 0 ? "%" + std::to_string(reg) : "_"; }

// The program's text is built as a std::string, numbers with std::to_chars and anything else
// by name, never through a std::ostream: a stream made in this library and written by
// libtorch's printers (or the other way round) crashed where the extension's build linked
// parts of libstdc++ statically (the GPU machine's toolchain, docs/cuda.md).

// The shortest text that reads back as the same double (1e-05, not 1.0000000000000001e-05),
// kept looking like a float (2.0, not 2).
std::string double_text(double value) {
  char buffer[64];
  const std::to_chars_result done = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, done.ptr);
  if (text.find_first_of(".eni") == std::string::npos) text += ".0";
  return text;
}

const char* layout_name(c10::Layout layout) {
  switch (layout) {
    case c10::kStrided: return "Strided";
    case c10::kSparse: return "Sparse";
    case c10::kSparseCsr: return "SparseCsr";
    case c10::kMkldnn: return "Mkldnn";
    default: return "Layout?";
  }
}

const char* memory_format_name(c10::MemoryFormat format) {
  switch (format) {
    case c10::MemoryFormat::Contiguous: return "Contiguous";
    case c10::MemoryFormat::Preserve: return "Preserve";
    case c10::MemoryFormat::ChannelsLast: return "ChannelsLast";
    case c10::MemoryFormat::ChannelsLast3d: return "ChannelsLast3d";
    default: return "MemoryFormat?";
  }
}

std::string sizes_text(c10::IntArrayRef sizes) {
  std::string text;
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text;
}

std::string scalar_text(const c10::Scalar& scalar) {
  if (scalar.isBoolean()) return scalar.toBool() ? "True" : "False";
  if (scalar.isIntegral(false)) return std::to_string(scalar.toLong());
  if (scalar.isFloatingPoint()) return double_text(scalar.toDouble());
  const c10::complex<double> z = scalar.toComplexDouble();
  return "complex(" + double_text(z.real()) + ", " + double_text(z.imag()) + ")";
}

// Enum arguments are boxed as ints; printed by name.
std::string constant_text(const c10::IValue& value, const c10::TypePtr& type) {
  if (value.isNone()) return "None";
  if (value.isBool()) return value.toBool() ? "True" : "False";
  if (value.isDouble()) return double_text(value.toDouble());
  if (value.isInt()) {
    c10::TypePtr t = type;
    if (t->kind() == c10::TypeKind::OptionalType) t = t->containedType(0);
    switch (t->kind()) {
      case c10::TypeKind::ScalarTypeType:
        return c10::toString(static_cast<c10::ScalarType>(value.toInt()));
      case c10::TypeKind::LayoutType:
        return layout_name(static_cast<c10::Layout>(value.toInt()));
      case c10::TypeKind::MemoryFormatType:
        return memory_format_name(static_cast<c10::MemoryFormat>(value.toInt()));
      default:
        return std::to_string(value.toInt());
    }
  }
  if (value.isSymInt()) {
    const c10::SymInt size = value.toSymInt();
    if (auto known = size.maybe_as_int()) return std::to_string(*known);
    return "<symbolic int>";
  }
  if (value.isString()) return "'" + value.toStringRef() + "'";
  if (value.isDevice()) return "device('" + value.toDevice().str() + "')";
  if (value.isScalar()) return scalar_text(value.toScalar());
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    // A number where the schema wants a tensor (x.add(1)): the number.
    if (tensor.unsafeGetTensorImpl()->is_wrapped_number()) return scalar_text(tensor.item());
    return std::string("tensor(") + c10::toString(tensor.scalar_type()) + "[" +
           sizes_text(tensor.sizes()) + "])";
  }
  if (value.isList()) {
    std::string text = "[";
    const c10::List<c10::IValue> items = value.toList();
    for (size_t i = 0; i < items.size(); ++i) {
      text += (i ? ", " : "") + constant_text(items.get(i), c10::AnyType::get());
    }
    return text + "]";
  }
  if (value.isTuple()) {
    std::string text = "(";
    const auto& items = value.toTupleRef().elements();
    for (size_t i = 0; i < items.size(); ++i) text += (i ? ", " : "") + constant_text(items[i], c10::AnyType::get());
    return text + (items.size() == 1 ? ",)" : ")");
  }
  return "<" + value.tagKind() + ">";
}

std::string operand_text(const Operand& operand, const c10::TypePtr& type) {
  switch (operand.kind) {
    case Operand::Kind::kRegister:
      return register_name(operand.reg);
    case Operand::Kind::kConstant:
      return constant_text(operand.constant, type);
    case Operand::Kind::kList: {
      std::string text = "[";
      const c10::TypePtr& elem = operand.list_type->containedType(0);
      for (size_t i = 0; i < operand.items.size(); ++i) {
        text += (i ? ", " : "") + operand_text(operand.items[i], elem);
      }
      return text + "]";
    }
  }
  return "?";
}

}  // namespace

std::string Program::to_string(const std::string& name) const {
  std::string out = "def " + name + "(";
  for (int i = 0; i < num_inputs_; ++i) out += (i ? ", " : "") + register_name(i);
  out += "):\n";
  auto registers = [](const std::vector<int>& regs) {
    std::string text;
    for (size_t i = 0; i < regs.size(); ++i) text += (i ? ", " : "") + register_name(regs[i]);
    return text;
  };
  for (const Instruction& instr : instructions_) {
    out += "    ";
    if (!instr.unpack.empty()) {
      out += "[" + registers(instr.unpack) + "] = ";
    } else if (!instr.outputs.empty()) {
      out += registers(instr.outputs) + " = ";
    }
    if (!instr.op) {
      out += instr.call_name + "(";
      for (size_t i = 0; i < instr.args.size(); ++i) {
        out += (i ? ", " : "") + operand_text(instr.args[i], c10::AnyType::get());
      }
      out += ")\n";
      continue;
    }
    const c10::FunctionSchema& schema = instr.op->schema();
    out += schema.name();
    if (!schema.overload_name().empty()) out += "." + schema.overload_name();
    out += "(";
    const auto& params = schema.arguments();
    for (size_t i = 0; i < instr.args.size(); ++i) {
      if (i) out += ", ";
      if (params[i].kwarg_only()) out += params[i].name() + "=";
      out += operand_text(instr.args[i], params[i].real_type());  // ScalarType, not int
    }
    out += ")\n";
  }
  out += "    return (";
  for (size_t i = 0; i < outputs_.size(); ++i) {
    out += (i ? ", " : "") + operand_text(outputs_[i], c10::AnyType::get());
  }
  out += outputs_.size() == 1 ? ",)\n" : ")\n";
  return out;
}

}  // namespace framejit::native
