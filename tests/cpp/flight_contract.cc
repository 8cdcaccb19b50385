// A Kindling job driven by Apache Arrow's C++ Flight client alone, following
// docs/protocol.md: create_job, start_job on every agent, one DoPut shard per
// agent with exactly-once metadata, end_of_data, job_status until the job
// ends, the model table through GetFlightInfo + DoGet. It also triggers the
// refusals the protocol documents and records how Arrow C++ reports each
// (arrow::StatusCode, the FlightStatusCode detail, and for DoPut the call
// where the refusal surfaced).
//
// Usage: flight_contract <job_id> <token> <rows_per_agent> <agent_url>...
// Prints one JSON object on stdout; exits non-zero on an unexpected error.

#include <arrow/api.h>
#include <arrow/flight/api.h>
#include <arrow/util/byte_size.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fl = arrow::flight;

namespace {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// The raw JSON text of `key`'s value in a flat or nested JSON object (the
// first occurrence): enough for the agent's compact replies.
std::string Field(const std::string& json, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  auto at = json.find(needle);
  if (at == std::string::npos) return "null";
  size_t i = at + needle.size();
  size_t start = i;
  int depth = 0;
  bool in_string = false;
  for (; i < json.size(); ++i) {
    char c = json[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') {
      if (depth == 0) break;
      --depth;
    } else if (c == ',' && depth == 0) break;
  }
  return json.substr(start, i - start);
}

std::string Unquote(const std::string& v) {
  if (v.size() >= 2 && v.front() == '"') return v.substr(1, v.size() - 2);
  return v;
}

// How Arrow C++ reports a refused call.
std::string ErrorJson(const arrow::Status& st, const std::string& surfaced_at = "") {
  std::ostringstream o;
  auto detail = fl::FlightStatusDetail::UnwrapStatus(st);
  o << "{\"arrow_code\":" << Quote(st.CodeAsString())
    << ",\"flight_code\":" << (detail ? Quote(detail->CodeAsString()) : "null")
    << ",\"message\":" << Quote(st.message());
  if (!surfaced_at.empty()) o << ",\"surfaced_at\":" << Quote(surfaced_at);
  o << "}";
  return o.str();
}

class Agent {
 public:
  static arrow::Result<Agent> Connect(const std::string& url, const std::string& token) {
    Agent a;
    ARROW_ASSIGN_OR_RAISE(auto location, fl::Location::Parse(url));
    ARROW_ASSIGN_OR_RAISE(a.client_, fl::FlightClient::Connect(location));
    a.options_.headers.emplace_back("authorization", "Bearer " + token);
    a.options_.timeout = fl::TimeoutDuration{60.0};
    return a;
  }

  // One action, its single JSON result.
  arrow::Result<std::string> Action(const std::string& name, const std::string& body,
                                    bool with_token = true) const {
    fl::Action action{name, arrow::Buffer::FromString(body)};
    fl::FlightCallOptions none;
    ARROW_ASSIGN_OR_RAISE(auto stream, client_->DoAction(with_token ? options_ : none, action));
    std::vector<std::string> bodies;
    for (;;) {
      ARROW_ASSIGN_OR_RAISE(auto result, stream->Next());
      if (!result) break;
      bodies.push_back(result->body->ToString());
    }
    if (bodies.size() != 1) {
      return arrow::Status::Invalid("action ", name, ": ", bodies.size(), " results");
    }
    return bodies[0];
  }

  fl::FlightClient* client() const { return client_.get(); }
  const fl::FlightCallOptions& options() const { return options_; }

 private:
  std::unique_ptr<fl::FlightClient> client_;
  fl::FlightCallOptions options_;
};

std::shared_ptr<arrow::Schema> RuleSchema() {
  return arrow::schema({arrow::field("x1", arrow::float64()), arrow::field("x2", arrow::float32()),
                        arrow::field("y", arrow::int32())});
}

// `rows` rows of y = (x1 + 2 x2 > 0.1), x uniform in [-1, 1] (a seeded LCG).
arrow::Result<std::shared_ptr<arrow::RecordBatch>> RuleBatch(int64_t rows, uint64_t seed) {
  arrow::DoubleBuilder x1;
  arrow::FloatBuilder x2;
  arrow::Int32Builder y;
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  auto uniform = [&state]() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53) * 2.0 - 1.0;
  };
  for (int64_t i = 0; i < rows; ++i) {
    double a = uniform();
    float b = static_cast<float>(uniform());
    ARROW_RETURN_NOT_OK(x1.Append(a));
    ARROW_RETURN_NOT_OK(x2.Append(b));
    ARROW_RETURN_NOT_OK(y.Append(a + 2.0 * static_cast<double>(b) > 0.1 ? 1 : 0));
  }
  ARROW_ASSIGN_OR_RAISE(auto a1, x1.Finish());
  ARROW_ASSIGN_OR_RAISE(auto a2, x2.Finish());
  ARROW_ASSIGN_OR_RAISE(auto a3, y.Finish());
  return arrow::RecordBatch::Make(RuleSchema(), rows, {a1, a2, a3});
}

// One producer's DoPut: a batch of `chunk` rows at a time, each with
// {"producer", "seq"} metadata, one ack read per batch, then the final ack.
arrow::Result<std::string> PutShard(const Agent& agent, const std::string& job_id,
                                    const std::string& producer,
                                    const std::shared_ptr<arrow::RecordBatch>& data,
                                    int64_t chunk) {
  auto descriptor = fl::FlightDescriptor::Path({job_id, "train"});
  ARROW_ASSIGN_OR_RAISE(auto put, agent.client()->DoPut(agent.options(), descriptor, data->schema()));
  std::ostringstream acks;
  acks << "[";
  int64_t seq = 0;
  for (int64_t offset = 0; offset < data->num_rows(); offset += chunk, ++seq) {
    auto batch = data->Slice(offset, chunk);
    std::string meta = "{\"producer\":" + Quote(producer) + ",\"seq\":" + std::to_string(seq) + "}";
    ARROW_RETURN_NOT_OK(put.writer->WriteWithMetadata(*batch, arrow::Buffer::FromString(meta)));
    std::shared_ptr<arrow::Buffer> ack;
    ARROW_RETURN_NOT_OK(put.reader->ReadMetadata(&ack));
    if (!ack) {
      // A refused stream: the reason comes with Close().
      auto closed = put.writer->Close();
      return closed.ok() ? arrow::Status::IOError("the stream ended early") : closed;
    }
    acks << (seq ? "," : "") << ack->ToString();
  }
  acks << "]";
  ARROW_RETURN_NOT_OK(put.writer->DoneWriting());
  std::shared_ptr<arrow::Buffer> final_ack;
  ARROW_RETURN_NOT_OK(put.reader->ReadMetadata(&final_ack));
  ARROW_RETURN_NOT_OK(put.writer->Close());
  if (!final_ack) return arrow::Status::IOError("no final ack for ", producer);
  return "{\"acks\":" + acks.str() + ",\"final\":" + final_ack->ToString() + "}";
}

// A DoPut the agent refuses (a label of the wrong type): which call reports it.
std::string RefusedPut(const Agent& agent, const std::string& job_id) {
  auto schema = arrow::schema({arrow::field("x1", arrow::float64()), arrow::field("x2", arrow::float32()),
                               arrow::field("y", arrow::utf8())});
  auto descriptor = fl::FlightDescriptor::Path({job_id, "train"});
  auto put = agent.client()->DoPut(agent.options(), descriptor, schema);
  if (!put.ok()) return ErrorJson(put.status(), "DoPut");
  arrow::DoubleBuilder x1;
  arrow::FloatBuilder x2;
  arrow::StringBuilder y;
  (void)x1.Append(0.5);
  (void)x2.Append(0.5f);
  (void)y.Append("one");
  auto batch = arrow::RecordBatch::Make(schema, 1, {*x1.Finish(), *x2.Finish(), *y.Finish()});
  auto st = put->writer->WriteWithMetadata(*batch, arrow::Buffer::FromString(
                                                       "{\"producer\":\"bad\",\"seq\":0}"));
  if (!st.ok()) return ErrorJson(st, "WriteWithMetadata");
  std::shared_ptr<arrow::Buffer> ack;
  st = put->reader->ReadMetadata(&ack);
  if (!st.ok()) return ErrorJson(st, "ReadMetadata");
  std::string read = ack ? "an ack" : "null";
  st = put->writer->DoneWriting();
  if (!st.ok()) return ErrorJson(st, "DoneWriting (ReadMetadata gave " + read + ")");
  st = put->writer->Close();
  if (!st.ok()) return ErrorJson(st, "Close (ReadMetadata gave " + read + ")");
  return "{\"surfaced_at\":\"nowhere\"}";
}

// What the agent's acks count as a batch's bytes: its buffers over its rows
// (pyarrow's RecordBatch.nbytes).
int64_t NBytes(const arrow::RecordBatch& batch) {
  auto size = arrow::util::ReferencedBufferSize(batch);
  return size.ok() ? *size : -1;
}

std::string ResultError(const arrow::Result<std::string>& r) {
  return r.ok() ? "{\"unexpected_ok\":" + Quote(*r) + "}" : ErrorJson(r.status());
}

arrow::Status Run(int argc, char** argv, std::string* out) {
  if (argc < 5) return arrow::Status::Invalid("usage: flight_contract <job_id> <token> <rows> <agent>...");
  const std::string job_id = argv[1];
  const std::string token = argv[2];
  const int64_t rows = std::stoll(argv[3]);
  std::vector<Agent> agents;
  for (int i = 4; i < argc; ++i) {
    ARROW_ASSIGN_OR_RAISE(auto a, Agent::Connect(argv[i], token));
    agents.push_back(std::move(a));
  }
  const auto slots = std::to_string(agents.size());
  std::ostringstream o;
  o << "{";

  // The refusals, each from a real call.
  o << "\"errors\":{";
  o << "\"malformed_body\":"
    << ResultError(agents[0].Action("start_job", "{\"job_id\":\"x\",\"rendezvous\":\"\",\"spec\":{}}"))
    << ",";
  o << "\"no_token\":" << ResultError(agents[0].Action("list_jobs", "{}", false)) << ",";
  o << "\"unknown_action\":" << ResultError(agents[0].Action("train_now", "{}")) << ",";
  o << "\"status_unknown_job\":" << ResultError(agents[0].Action("job_status", "{\"job_id\":\"nope\"}"));

  // create_job once, through the first agent.
  ARROW_ASSIGN_OR_RAISE(auto created,
                        agents[0].Action("create_job", "{\"job_id\":" + Quote(job_id) +
                                                           ",\"num_slots\":" + slots + "}"));
  const std::string rendezvous = Unquote(Field(created, "rendezvous"));
  const std::string spec =
      "{\"model\":{\"kind\":\"linear\"},\"task\":{\"kind\":\"classification\",\"num_classes\":2},"
      "\"loss\":\"cross_entropy\",\"optimizer\":{\"kind\":\"adam\",\"learning_rate\":0.05},"
      "\"epochs\":6,\"batch_size\":32,\"num_slots\":" +
      slots + ",\"seed\":3,\"features\":[\"x1\",\"x2\"],\"label\":\"y\"}";
  // A start_job whose unknown-job refusal is NOT_FOUND needs a real spec.
  o << ",\"start_unknown_job_with_spec\":"
    << ResultError(agents[0].Action("start_job", "{\"job_id\":\"never-created\",\"spec\":" + spec +
                                                     ",\"rendezvous\":" + Quote(rendezvous) + "}"));
  o << "},\"created\":" << created << ",\"started\":[";
  for (size_t i = 0; i < agents.size(); ++i) {
    ARROW_ASSIGN_OR_RAISE(auto started,
                          agents[i].Action("start_job", "{\"job_id\":" + Quote(job_id) + ",\"spec\":" +
                                                            spec + ",\"rendezvous\":" + Quote(rendezvous) + "}"));
    o << (i ? "," : "") << started;
  }
  o << "]";

  // Before it succeeded the model is FAILED_PRECONDITION.
  auto early = agents[0].client()->GetFlightInfo(agents[0].options(),
                                                 fl::FlightDescriptor::Path({job_id, "model"}));
  o << ",\"model_too_early\":"
    << (early.ok() ? std::string("{\"unexpected_ok\":true}") : ErrorJson(early.status()));
  o << ",\"refused_put\":" << RefusedPut(agents[0], job_id);

  o << ",\"puts\":[";
  for (size_t i = 0; i < agents.size(); ++i) {
    ARROW_ASSIGN_OR_RAISE(auto data, RuleBatch(rows, 11 + i));
    ARROW_ASSIGN_OR_RAISE(auto put, PutShard(agents[i], job_id, "cpp-" + std::to_string(i), data, 250));
    // The same producer again: every batch a duplicate, nothing stored.
    ARROW_ASSIGN_OR_RAISE(auto again, PutShard(agents[i], job_id, "cpp-" + std::to_string(i), data, 250));
    const std::string final_ack = Field(put, "final");
    // A wrong expected_rows is refused and changes nothing; the right one is accepted.
    auto wrong = agents[i].Action("end_of_data", "{\"job_id\":" + Quote(job_id) +
                                                     ",\"split\":\"train\",\"expected_rows\":" +
                                                     std::to_string(rows + 1) + "}");
    ARROW_ASSIGN_OR_RAISE(auto eod, agents[i].Action("end_of_data", "{\"job_id\":" + Quote(job_id) +
                                                                        ",\"split\":\"train\",\"expected_rows\":" +
                                                                        Field(final_ack, "stream_rows") + "}"));
    o << (i ? "," : "") << "{\"put\":" << put << ",\"again_final\":" << Field(again, "final")
      << ",\"end_of_data_wrong\":" << ResultError(wrong) << ",\"end_of_data\":" << eod
      << ",\"nbytes\":" << NBytes(*data->Slice(0, 250)) << "}";
  }
  o << "]";

  // Follow job_status on every agent until the job ends.
  o << ",\"statuses\":[";
  for (size_t i = 0; i < agents.size(); ++i) {
    std::string status;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    for (;;) {
      ARROW_ASSIGN_OR_RAISE(status, agents[i].Action("job_status", "{\"job_id\":" + Quote(job_id) + "}"));
      auto state = Unquote(Field(status, "state"));
      if (state == "succeeded" || state == "failed" || state == "cancelled") break;
      if (std::chrono::steady_clock::now() > deadline) return arrow::Status::IOError("job not done: ", status);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    o << (i ? "," : "") << "{\"state\":" << Field(status, "state") << ",\"rows_train\":"
      << Field(status, "rows_train") << ",\"epochs\":" << Field(status, "epochs")
      << ",\"history\":" << Field(status, "history") << ",\"error\":" << Field(status, "error") << "}";
  }
  o << "]";

  // The model table: GetFlightInfo for the ticket, DoGet for the rows.
  ARROW_ASSIGN_OR_RAISE(auto info, agents[0].client()->GetFlightInfo(
                                       agents[0].options(), fl::FlightDescriptor::Path({job_id, "model"})));
  ARROW_ASSIGN_OR_RAISE(auto stream, agents[0].client()->DoGet(agents[0].options(), info->endpoints()[0].ticket));
  ARROW_ASSIGN_OR_RAISE(auto table, stream->ToTable());
  ARROW_ASSIGN_OR_RAISE(table, table->CombineChunks());
  o << ",\"model\":{\"rows\":" << table->num_rows() << ",\"total_records\":" << info->total_records()
    << ",\"schema\":" << Quote(table->schema()->ToString()) << ",\"params\":[";
  auto names = std::static_pointer_cast<arrow::StringArray>(table->GetColumnByName("name")->chunk(0));
  auto shapes = std::static_pointer_cast<arrow::ListArray>(table->GetColumnByName("shape")->chunk(0));
  auto values = std::static_pointer_cast<arrow::ListArray>(table->GetColumnByName("values")->chunk(0));
  auto dims = std::static_pointer_cast<arrow::UInt64Array>(shapes->values());
  for (int64_t r = 0; r < table->num_rows(); ++r) {
    o << (r ? "," : "") << "{\"name\":" << Quote(names->GetString(r)) << ",\"shape\":[";
    for (int32_t d = shapes->value_offset(r); d < shapes->value_offset(r + 1); ++d) {
      o << (d > shapes->value_offset(r) ? "," : "") << dims->Value(d);
    }
    o << "],\"len\":" << values->value_length(r) << "}";
  }
  o << "]}}";
  *out = o.str();
  return arrow::Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  auto st = Run(argc, argv, &out);
  if (!st.ok()) {
    std::cerr << "flight_contract: " << st.ToString() << std::endl;
    return 1;
  }
  std::cout << out << std::endl;
  return 0;
}
