/**
 * An agent loop without an LLM, in TypeScript: a scripted "model" calls tools backed by an
 * airlock session (write a file, run a command), reads the error, fixes the code and runs
 * it again, until the program works. The TypeScript twin of examples/agent_loop.py.
 *
 * The loop is the shape of a real tool-calling agent (the model answers tool calls, the
 * loop executes them and feeds back the results); only the model is replaced by a script,
 * so the example runs anywhere a daemon runs:
 *
 *     sudo airlock serve &                                  # http://127.0.0.1:8710
 *     cd clients/typescript && npm ci && npm run build && npm run build:test
 *     node build/examples/typescript/agent_loop.js          # AIRLOCK_URL=http://HOST:PORT (AIRLOCK_API_KEY)
 *
 * Exits 0 when the task is solved, 1 otherwise.
 */

import { Airlock, type ExecResult, type Sandbox } from "airlock-sandbox";

const TASK = "Write report.py: read scores.csv, print the average score per team, highest first.";

const SCORES = "team,score\nred,7\nblue,9\nred,5\nblue,8\ngreen,6\n";

// The model's first attempt has two bugs: a misspelled name and a header row parsed as data.
const FIRST_DRAFT = `import csv
from collections import defaultdict

totals = defaultdict(list)
with open("scores.csv") as f:
    for team, score in csv.reader(f):
        totals[team].append(int(score))

averages = {team: sum(s) / len(s) for team, s in total.items()}
for team, avg in sorted(averages.items(), key=lambda kv: -kv[1]):
    print(f"{team}: {avg:.2f}")
`;

/** The tools the model may call, as a function-calling API would describe them. */
const TOOLS = {
  write_file: {
    description: "Write a file into the sandbox's /workspace",
    parameters: { path: "string", content: "string" },
  },
  run: {
    description: "Run a command (an argv) in the sandbox; returns its exit status and output",
    parameters: { cmd: "string[]" },
  },
} as const;

type ToolName = keyof typeof TOOLS;

/** What the model answers: a tool call, or a final answer. */
type Turn =
  | { kind: "tool"; name: "write_file"; args: { path: string; content: string } }
  | { kind: "tool"; name: "run"; args: { cmd: string[] } }
  | { kind: "final"; answer: string };

interface Step {
  turn: Turn;
  observation: string;
}

/** Stands in for an LLM: decides the next turn from the last observation. */
class ScriptedModel {
  private code = "";

  next(history: Step[]): Turn {
    if (history.length === 0) {
      this.code = FIRST_DRAFT;
      return { kind: "tool", name: "write_file", args: { path: "report.py", content: this.code } };
    }
    const last = history[history.length - 1]!;
    if (last.turn.kind === "tool" && last.turn.name === "write_file") {
      return { kind: "tool", name: "run", args: { cmd: ["python3", "report.py"] } };
    }
    if (last.observation.startsWith("exit code 0")) {
      return { kind: "final", answer: last.observation.split("\n").slice(1).join("\n").trim() };
    }
    const fixed = this.fix(last.observation);
    if (fixed === null) return { kind: "final", answer: "I could not fix it:\n" + last.observation };
    this.code = fixed;
    return { kind: "tool", name: "write_file", args: { path: "report.py", content: this.code } };
  }

  /** The "reasoning": match the error and patch the code. */
  private fix(error: string): string | null {
    const m = /NameError: name '(\w+)' is not defined/.exec(error);
    if (m && m[1] === "total") return this.code.replace("total.items()", "totals.items()");
    if (error.includes("invalid literal for int() with base 10: 'score'")) {
      return this.code.replace(
        "    for team, score in csv.reader(f):",
        "    rows = csv.reader(f)\n    next(rows)  # skip the header\n    for team, score in rows:",
      );
    }
    return null;
  }
}

/** What the model sees of a run: exit status first, then the output. */
function observe(r: ExecResult): string {
  const status = r.exit_code !== null ? `exit code ${r.exit_code}` : `killed (${r.outcome})`;
  return `${status}\n${r.stdout}${r.stderr}`;
}

/** Executes a tool call in the sandbox. */
async function callTool(sb: Sandbox, turn: Extract<Turn, { kind: "tool" }>): Promise<string> {
  const name: ToolName = turn.name;
  switch (turn.name) {
    case "write_file":
      await sb.writeFile(turn.args.path, turn.args.content);
      return `wrote ${turn.args.path} (${turn.args.content.length} bytes)`;
    case "run":
      return observe(await sb.exec(turn.args.cmd, { timeoutMs: 10_000 }));
    default:
      throw new Error(`unknown tool ${name}`);
  }
}

async function main(): Promise<number> {
  const al = new Airlock(); // $AIRLOCK_URL (default http://127.0.0.1:8710), $AIRLOCK_API_KEY
  const model = new ScriptedModel();
  const history: Step[] = [];
  console.log(`task: ${TASK}\ntools: ${Object.keys(TOOLS).join(", ")}\n`);
  await using sb = await al.createSandbox({ ttlS: 300 });
  await sb.writeFile("scores.csv", SCORES);
  for (let step = 1; step <= 10; step++) {
    const turn = model.next(history);
    if (turn.kind === "final") {
      console.log(`[${step}] final answer:\n${turn.answer}`);
      return turn.answer.startsWith("I could not") ? 1 : 0;
    }
    const observation = await callTool(sb, turn);
    const label = turn.name === "write_file" ? turn.args.path : turn.args.cmd.join(" ");
    console.log(`[${step}] ${turn.name} ${label}`);
    console.log("    " + observation.trim().replaceAll("\n", "\n    ") + "\n");
    history.push({ turn, observation });
  }
  console.log("gave up after 10 steps");
  return 1;
}

try {
  process.exitCode = await main();
} catch (e) {
  console.error(`${(e as Error).name}: ${(e as Error).message}`);
  process.exitCode = 1;
}
