// A real Apache BookKeeper client for the interop suite, driven line by line.
//
// One JVM serves a whole test session: starting one per operation would cost a JVM start and
// a client bootstrap (seconds) each time. Every line on stdin is one JSON command; every
// answer is one JSON line on stdout, {"ok":true,...} or {"ok":false,"error":...,"code":...}
// (BKException's code where the client gave one). The client's own logging goes to stderr.
//
// Entry payloads are deterministic so that Python can check what it reads without being told:
// entry e of ledger l is "l=<l> e=<e> " repeated, cut to `size` bytes (at least the first
// repetition, whatever `size` says).
//
// Written for this project against BookKeeper's public client API.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Enumeration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.bookkeeper.client.BKException;
import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.BookKeeperAdmin;
import org.apache.bookkeeper.client.LedgerChecker;
import org.apache.bookkeeper.client.LedgerEntry;
import org.apache.bookkeeper.client.LedgerFragment;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.client.api.LedgerMetadata;
import org.apache.bookkeeper.conf.ClientConfiguration;
import org.apache.bookkeeper.net.BookieId;
import org.apache.bookkeeper.util.AvailabilityOfEntriesOfLedger;

public class BkClient {
    private static final ObjectMapper JSON = new ObjectMapper();
    private final BookKeeper bk;
    private final BookKeeperAdmin admin;
    private final Map<String, LedgerHandle> handles = new HashMap<>();

    BkClient(String uri) throws Exception {
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(uri);
        conf.setZkTimeout(10000);
        conf.setAddEntryTimeout(5);
        conf.setReadEntryTimeout(5);
        // Tests stop bookies on purpose: do not wait long for one that is gone.
        conf.setBookieErrorThresholdPerInterval(1000);
        bk = new BookKeeper(conf);
        admin = new BookKeeperAdmin(bk);
    }

    static byte[] payload(long ledger, long entry, int size) {
        byte[] unit = ("l=" + ledger + " e=" + entry + " ").getBytes(StandardCharsets.US_ASCII);
        int n = Math.max(size, unit.length);
        byte[] out = new byte[n];
        for (int i = 0; i < n; i++) {
            out[i] = unit[i % unit.length];
        }
        return out;
    }

    static BookKeeper.DigestType digest(JsonNode cmd) {
        return BookKeeper.DigestType.valueOf(cmd.path("digest").asText("CRC32"));
    }

    static byte[] password(JsonNode cmd) {
        return cmd.path("password").asText("").getBytes(StandardCharsets.UTF_8);
    }

    ObjectNode describe(LedgerMetadata md) {
        ObjectNode out = JSON.createObjectNode();
        out.put("ledger", md.getLedgerId());
        out.put("ensemble", md.getEnsembleSize());
        out.put("write", md.getWriteQuorumSize());
        out.put("ack", md.getAckQuorumSize());
        out.put("closed", md.isClosed());
        out.put("state", md.getState().toString());
        out.put("last_entry", md.getLastEntryId());
        out.put("length", md.getLength());
        ObjectNode segments = out.putObject("ensembles");
        for (Map.Entry<Long, ? extends List<BookieId>> e : md.getAllEnsembles().entrySet()) {
            ArrayNode ids = segments.putArray(Long.toString(e.getKey()));
            for (BookieId b : e.getValue()) {
                ids.add(b.toString());
            }
        }
        return out;
    }

    int addEntries(LedgerHandle lh, int count, int size, ArrayNode confirmed) throws Exception {
        int added = 0;
        for (int i = 0; i < count; i++) {
            long next = lh.getLastAddPushed() + 1;
            long id = lh.addEntry(payload(lh.getId(), next, size));
            if (confirmed != null) {
                confirmed.add(id);
            }
            added++;
        }
        return added;
    }

    ObjectNode handle(JsonNode cmd) throws Exception {
        String op = cmd.path("op").asText();
        ObjectNode out = JSON.createObjectNode();
        out.put("ok", true);
        switch (op) {
            case "create": {
                // Custom metadata as given (a test's way to make a ledger that looks like
                // Pulsar's): each value a UTF-8 string.
                Map<String, byte[]> custom = new HashMap<>();
                cmd.path("custom").fields().forEachRemaining(
                        f -> custom.put(f.getKey(), f.getValue().asText().getBytes(StandardCharsets.UTF_8)));
                LedgerHandle lh = bk.createLedger(
                        cmd.path("ensemble").asInt(3), cmd.path("write").asInt(2),
                        cmd.path("ack").asInt(2), digest(cmd), password(cmd), custom);
                addEntries(lh, cmd.path("entries").asInt(0), cmd.path("size").asInt(64), null);
                out.put("ledger", lh.getId());
                out.put("lac", lh.getLastAddConfirmed());
                if (cmd.path("close").asBoolean(true)) {
                    lh.close();
                } else {
                    handles.put(Long.toString(lh.getId()), lh);
                }
                out.set("metadata", describe(lh.getLedgerMetadata()));
                return out;
            }
            case "add": {
                LedgerHandle lh = handles.get(cmd.path("ledger").asText());
                if (lh == null) {
                    throw new IllegalArgumentException("no open handle for ledger " + cmd.path("ledger"));
                }
                ArrayNode confirmed = out.putArray("confirmed");
                try {
                    addEntries(lh, cmd.path("entries").asInt(1), cmd.path("size").asInt(64), confirmed);
                } catch (BKException e) {
                    out.put("ok", false);
                    out.put("error", e.getMessage());
                    out.put("code", e.getCode());
                }
                out.put("lac", lh.getLastAddConfirmed());
                out.set("metadata", describe(lh.getLedgerMetadata()));
                return out;
            }
            case "close": {
                LedgerHandle lh = handles.remove(cmd.path("ledger").asText());
                if (lh == null) {
                    throw new IllegalArgumentException("no open handle for ledger " + cmd.path("ledger"));
                }
                lh.close();
                out.set("metadata", describe(lh.getLedgerMetadata()));
                return out;
            }
            case "read": {
                long id = cmd.path("ledger").asLong();
                boolean recovery = cmd.path("recovery").asBoolean(false);
                LedgerHandle lh = recovery
                        ? bk.openLedger(id, digest(cmd), password(cmd))
                        : bk.openLedgerNoRecovery(id, digest(cmd), password(cmd));
                try {
                    long lac = lh.getLastAddConfirmed();
                    long read = 0;
                    ArrayNode bad = out.putArray("mismatched");
                    if (lac >= 0) {
                        Enumeration<LedgerEntry> entries = lh.readEntries(0, lac);
                        while (entries.hasMoreElements()) {
                            LedgerEntry e = entries.nextElement();
                            byte[] data = e.getEntry();
                            byte[] want = payload(id, e.getEntryId(), 0);
                            byte[] head = Arrays.copyOf(data, Math.min(data.length, want.length));
                            if (!Arrays.equals(head, want)) {
                                bad.add(e.getEntryId());
                            }
                            read++;
                        }
                    }
                    out.put("lac", lac);
                    out.put("entries", read);
                    out.set("metadata", describe(lh.getLedgerMetadata()));
                } finally {
                    lh.close();
                }
                return out;
            }
            case "metadata": {
                LedgerMetadata md = bk.getLedgerManager()
                        .readLedgerMetadata(cmd.path("ledger").asLong()).get().getValue();
                out.set("metadata", describe(md));
                return out;
            }
            case "list": {
                AvailabilityOfEntriesOfLedger av = admin.asyncGetListOfEntriesOfLedger(
                        BookieId.parse(cmd.path("bookie").asText()), cmd.path("ledger").asLong()).get();
                ArrayNode present = out.putArray("entries");
                long last = cmd.path("last").asLong(-1);
                for (long e = 0; e <= last; e++) {
                    if (av.isEntryAvailable(e)) {
                        present.add(e);
                    }
                }
                out.put("available", av.getTotalNumOfAvailableEntries());
                out.put("bytes", java.util.Base64.getEncoder().encodeToString(av.serializeStateOfEntriesOfLedger()));
                return out;
            }
            case "check": {
                // BookKeeper's own LedgerChecker (what Java's auditor and worker run): the
                // fragments it finds bad, each with the bookies it found unable to serve it.
                long id = cmd.path("ledger").asLong();
                LedgerHandle lh = bk.openLedgerNoRecovery(id, digest(cmd), password(cmd));
                try {
                    CompletableFuture<Set<LedgerFragment>> found = new CompletableFuture<>();
                    new LedgerChecker(bk).checkLedger(lh, (rc, fragments) -> {
                        if (rc == BKException.Code.OK) {
                            found.complete(fragments);
                        } else {
                            found.completeExceptionally(BKException.create(rc));
                        }
                    }, cmd.path("percentage").asLong(0));
                    ArrayNode bad = out.putArray("fragments");
                    for (LedgerFragment f : found.get(30, TimeUnit.SECONDS)) {
                        ObjectNode fragment = bad.addObject();
                        fragment.put("first", f.getFirstEntryId());
                        fragment.put("last", f.getLastKnownEntryId());
                        ArrayNode bookies = fragment.putArray("bookies");
                        for (int i : new TreeSet<>(f.getBookiesIndexes())) {
                            bookies.add(f.getAddress(i).toString());
                        }
                    }
                } finally {
                    lh.close();
                }
                return out;
            }
            case "delete": {
                bk.deleteLedger(cmd.path("ledger").asLong());
                return out;
            }
            case "ping":
                return out;
            default:
                throw new IllegalArgumentException("unknown op " + op);
        }
    }

    public static void main(String[] args) throws Exception {
        PrintStream answers = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        // Only our answers on stdout: the client's log lines go where stderr goes.
        System.setOut(System.err);
        BkClient client = new BkClient(args[0]);
        answers.println("{\"ok\":true,\"ready\":true}");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            ObjectNode out;
            try {
                out = client.handle(JSON.readTree(line));
            } catch (Throwable t) {
                Throwable cause = t;
                while (cause.getCause() != null && !(cause instanceof BKException)) {
                    cause = cause.getCause();
                }
                out = JSON.createObjectNode();
                out.put("ok", false);
                out.put("error", cause.getClass().getSimpleName() + ": " + cause.getMessage());
                if (cause instanceof BKException) {
                    out.put("code", ((BKException) cause).getCode());
                }
            }
            answers.println(JSON.writeValueAsString(out));
        }
        for (LedgerHandle lh : client.handles.values()) {
            try {
                lh.close();
            } catch (Exception e) {
                // the test is over; an open ledger stays open
            }
        }
        client.admin.close();
        client.bk.close();
    }
}
