// readme/errors.ts
import { Airlock, AirlockError, InvalidRequest, RateLimited } from "airlock-sandbox";

const al = new Airlock({ retries: 2, timeoutMs: 30_000 });
try {
  await al.run({ code: "print(1)", limits: { memory_bytes: 2 ** 50 } });
} catch (e) {
  if (e instanceof InvalidRequest) {
    console.log(e.status, e.code, e.field); // 400 invalid_request limits.memory_bytes
  } else if (e instanceof RateLimited) {
    console.log(`busy: retry in ${e.retryAfter} s`);
  } else if (e instanceof AirlockError) {
    console.log(e.message);
  } else throw e;
}
